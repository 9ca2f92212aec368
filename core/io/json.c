/* json.c - the shared cJSON helpers (see json.h). */
#include "io/json.h"

const char *fp4rl_json_type(const cJSON *j)
{
    if (!j) return "nothing";
    if (cJSON_IsNumber(j)) return "number";
    if (cJSON_IsString(j)) return "string";
    if (cJSON_IsArray(j)) return "array";
    if (cJSON_IsObject(j)) return "object";
    if (cJSON_IsBool(j)) return "boolean";
    if (cJSON_IsNull(j)) return "null";
    return "value";
}

bool fp4rl_json_add(cJSON *parent, const char *key, cJSON *item)
{
    if (!item) return false;
    bool ok = key ? cJSON_AddItemToObject(parent, key, item) : cJSON_AddItemToArray(parent, item);
    if (!ok) cJSON_Delete(item);
    return ok;
}
