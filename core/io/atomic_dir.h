/*
 * atomic_dir.h - write a directory atomically and never destroy what is not ours.
 *
 * The one owner of replacing a directory of fp4rl output (RL checkpoints, pretrained model
 * directories). A writer stages everything in a fresh hidden sibling of the target, then commits:
 *
 *   fp4rl_dir_stage(target, marker)  refuses a target that is not absent, an empty directory or a
 *                                    directory holding the file `marker` (an earlier commit of the
 *                                    same kind), touching nothing; creates <parent>/.<name>.fp4rl-tmp.<pid>.<rand>
 *                                    holding the in-progress file FP4RL_DIR_STAGING ("pid <pid>")
 *   ... the writer fills the staging directory ...
 *   fp4rl_dir_commit(tmp, target)    fsyncs every file, writes `marker` LAST, moves the previous
 *                                    target aside to <parent>/.<name>.fp4rl-old.<pid>.<rand>, renames
 *                                    the staging directory into place, fsyncs the parent, and only
 *                                    then removes the previous target
 *
 * A crash at any point leaves either the previous target or the new one at `target`, except
 * between the two renames, where the previous one is at its .fp4rl-old sibling:
 * fp4rl_dir_recover (called by every stage, and by readers before they read) renames it back.
 * Leftovers of a killed writer are removed only when they are provably ours: the name pattern of
 * this target, the in-progress file (staging) or the marker (a previous target moved aside), and a
 * writer pid that is no longer alive on this host (the writer and the cleaner share a host; a
 * directory on a shared file system written from another host is left alone when that pid lives).
 */
#ifndef FP4RL_ATOMIC_DIR_H
#define FP4RL_ATOMIC_DIR_H

#include "runtime/internal.h"

/* The in-progress file of a staging directory (removed from the target after the commit). */
#define FP4RL_DIR_STAGING ".fp4rl-staging"

/* Creates a fresh, uniquely named hidden sibling staging directory of `target` after checking that
 * `target` is absent, an empty directory, or a directory holding the file `marker`; anything else
 * (a regular file, a symbolic link, a foreign directory, a special file) is refused with
 * FP4RL_ERR_INVALID_ARGUMENT naming the path, touching nothing. Also removes the stale
 * leftovers of this target it can prove are its own (fp4rl_dir_recover). *tmp_out is malloc'd. */
FP4RL_HIDDEN fp4rl_status fp4rl_dir_stage(const char *target, const char *marker, char **tmp_out, const char *fn);
/* fsyncs every file in tmp, writes `marker` into tmp LAST (fsync'd), then swaps tmp into place
 * (the old target moved aside to a sibling, renamed, parent fsync'd, old removed last); on any
 * failure the previous target is restored and tmp removed. Frees tmp. */
FP4RL_HIDDEN fp4rl_status fp4rl_dir_commit(char *tmp, const char *target, const char *marker, const char *fn);
/* Removes a staging directory after a failure and frees it (NULL is fine). */
FP4RL_HIDDEN void fp4rl_dir_abort(char *tmp);
/* Best effort, no error: puts back a previous target that a killed commit left moved aside (when
 * `target` is absent), and removes the stale staging and moved-aside directories of `target` that
 * are provably ours (see above). */
FP4RL_HIDDEN void fp4rl_dir_recover(const char *target, const char *marker);
/* Writes the file `marker` (fsync'd) into the existing directory `dir`: adopts a directory its
 * caller has recognised as its own by other means (e.g. a checkpoint written before markers). */
FP4RL_HIDDEN fp4rl_status fp4rl_dir_mark(const char *dir, const char *marker, const char *fn);

#endif
