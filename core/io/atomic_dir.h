/*
 * atomic_dir.h - write a directory atomically and never destroy what is not ours (internal).
 *
 * A writer stages everything in a fresh hidden sibling of the target, then commits:
 *   fp4rl_dir_stage(target, marker, &tmp, fn)  refuses a target that is not absent, an empty
 *                                              directory or a directory holding the file `marker`
 *                                              (an earlier commit of the same kind), touching
 *                                              nothing; creates <parent>/.<name>.fp4rl-tmp.<pid>.<n>
 *   ... the writer fills tmp (flat: files only) ...
 *   fp4rl_dir_commit(tmp, target, marker, fn)  fsyncs every file, writes `marker` LAST, moves the
 *                                              previous target aside, renames tmp into place,
 *                                              fsyncs the parent, then removes the previous target
 *   fp4rl_dir_abort(tmp)                       removes tmp after a failure
 *
 * NOTE: a minimal implementation written for fp4rl_model_save_pretrained (w/hf) against the API of
 * the shared module being written on w/hostile; that module (with crash recovery of leftovers)
 * replaces this one when the branches meet.
 */
#ifndef FP4RL_ATOMIC_DIR_H
#define FP4RL_ATOMIC_DIR_H

#include "runtime/internal.h"

/* FP4RL_ERR_INVALID_ARGUMENT naming the path for a target that is a regular file, a symbolic link,
 * a special file or a directory without `marker` (not empty); FP4RL_ERR_IO when tmp cannot be made.
 * *tmp_out is malloc'd. */
FP4RL_HIDDEN fp4rl_status fp4rl_dir_stage(const char *target, const char *marker, char **tmp_out, const char *fn);
/* On failure the previous target is restored and tmp removed. Frees tmp. */
FP4RL_HIDDEN fp4rl_status fp4rl_dir_commit(char *tmp, const char *target, const char *marker, const char *fn);
/* Removes a staging directory and frees it (NULL is fine). */
FP4RL_HIDDEN void fp4rl_dir_abort(char *tmp);

#endif
