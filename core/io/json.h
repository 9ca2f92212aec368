/* json.h - the small cJSON helpers shared by the JSON readers and writers (safetensors headers,
 * config.json, checkpoint manifests). cJSON is included here, one way, for every user. */
#ifndef FP4RL_IO_JSON_H
#define FP4RL_IO_JSON_H

#include <stdbool.h>

#include <cjson/cJSON.h>

/* The JSON kind of j for error messages ("number", "object", ...; "nothing" for NULL). */
const char *fp4rl_json_type(const cJSON *j);

/* Adds item to parent: under key when key is set (parent an object), else appended (parent an
 * array). false when item is NULL (a failed cJSON_Create*) or cannot be added; item is then freed,
 * so callers can chain `ok = ok && fp4rl_json_add(...)` without leaking. */
bool fp4rl_json_add(cJSON *parent, const char *key, cJSON *item);

#endif
