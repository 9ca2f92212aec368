/*
 * atomic_dir.c - write a directory atomically and never destroy what is not ours (see atomic_dir.h).
 */
#define _GNU_SOURCE /* nftw, fsync */
#include "io/atomic_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TMP_TAG ".fp4rl-tmp."
#define OLD_TAG ".fp4rl-old."
#define PATH_BUF 8192
#define MAX_TARGET 3000 /* leaves room for the sibling names in a PATH_MAX buffer */

/* A target split into its parent directory and its last component (trailing slashes dropped). */
typedef struct dpath {
    char parent[MAX_TARGET + 8], name[1024];
} dpath;

static fp4rl_status split(const char *target, dpath *d, const char *fn)
{
    size_t n = target ? strlen(target) : 0;
    if (n == 0 || n > MAX_TARGET)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: the directory path is empty or longer than %d bytes", fn, MAX_TARGET);
    while (n > 1 && target[n - 1] == '/') n--;
    size_t cut = n;
    while (cut > 0 && target[cut - 1] != '/') cut--;
    const size_t name_len = n - cut;
    if (name_len == 0 || name_len >= sizeof d->name || (name_len == 1 && target[cut] == '.') ||
        (name_len == 2 && target[cut] == '.' && target[cut + 1] == '.'))
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: %s does not name a directory entry that can be replaced", fn, target);
    memcpy(d->name, target + cut, name_len);
    d->name[name_len] = 0;
    if (cut == 0) snprintf(d->parent, sizeof d->parent, ".");
    else if (cut == 1) snprintf(d->parent, sizeof d->parent, "/");
    else {
        memcpy(d->parent, target, cut - 1);
        d->parent[cut - 1] = 0;
    }
    return FP4RL_OK;
}

/* dir/file into out; false when it does not fit */
static int join(char *out, size_t cap, const char *dir, const char *file)
{
    const int n = snprintf(out, cap, "%s/%s", dir, file);
    return n > 0 && (size_t)n < cap;
}

static int is_regular(const char *dir, const char *file)
{
    char path[PATH_BUF];
    struct stat sb;
    return join(path, sizeof path, dir, file) && lstat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int is_empty_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int empty = 1;
    for (struct dirent *e; empty && (e = readdir(d));)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) empty = 0;
    closedir(d);
    return empty;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}
/* Removes a tree without following symbolic links (a link is removed, never its target). */
static void rm_tree(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static fp4rl_status fsync_path(const char *path, const char *fn)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW);
    if (fd < 0 || fsync(fd) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return fp4rl_fail(FP4RL_ERR_IO, "%s: fsync %s: %s", fn, path, strerror(e));
    }
    close(fd);
    return FP4RL_OK;
}

static int sync_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb; (void)ftw;
    if (flag != FTW_F && flag != FTW_DP) return 0;
    return fsync_path(path, "fp4rl_dir_commit") == FP4RL_OK ? 0 : 1;
}

static fp4rl_status write_synced(const char *dir, const char *file, const char *text, const char *fn)
{
    char path[PATH_BUF];
    if (!join(path, sizeof path, dir, file)) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: %s/%s is too long", fn, dir, file);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644);
    const size_t n = strlen(text);
    int ok = fd >= 0 && write(fd, text, n) == (ssize_t)n && fsync(fd) == 0;
    int e = errno;
    if (fd >= 0 && close(fd) != 0) ok = 0;
    return ok ? FP4RL_OK : fp4rl_fail(FP4RL_ERR_IO, "%s: writing %s: %s", fn, path, strerror(e));
}

/* FP4RL_OK when `target` may be replaced: absent (*exists = 0), an empty directory or one holding
 * `marker`. Anything else is refused, naming the path. */
static fp4rl_status check_target(const char *target, const char *marker, int *exists, const char *fn)
{
    struct stat sb;
    *exists = 0;
    if (lstat(target, &sb) != 0) {
        if (errno == ENOENT) return FP4RL_OK;
        return fp4rl_fail(FP4RL_ERR_IO, "%s: cannot inspect %s: %s", fn, target, strerror(errno));
    }
    *exists = 1;
    if (S_ISLNK(sb.st_mode))
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: %s is a symbolic link; refusing to replace it (pass the directory itself)", fn, target);
    if (!S_ISDIR(sb.st_mode))
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: %s exists and is not a directory (%s); refusing to replace it",
                          fn, target, S_ISREG(sb.st_mode) ? "a regular file" : "a special file");
    if (is_regular(target, marker) || is_empty_dir(target)) return FP4RL_OK;
    return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT,
                      "%s: %s is a non-empty directory that fp4rl did not write (it has no %s file); refusing to replace it",
                      fn, target, marker);
}

/* The pid a leftover's name carries after its tag, or 0 when the rest is not "<pid>.<suffix>". */
static long leftover_pid(const char *rest)
{
    char *end = NULL;
    errno = 0;
    const long pid = strtol(rest, &end, 10);
    return !errno && end != rest && *end == '.' && end[1] && pid > 0 ? pid : 0;
}

static int pid_alive(long pid)
{
    return pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH;
}

void fp4rl_dir_recover(const char *target, const char *marker)
{
    dpath d;
    if (split(target, &d, "fp4rl_dir_recover")) return;
    DIR *dir = opendir(d.parent);
    if (!dir) return;
    char prefix[1100], path[PATH_BUF], buf[PATH_BUF];
    snprintf(prefix, sizeof prefix, ".%s", d.name);
    const size_t plen = strlen(prefix);
    for (struct dirent *e; (e = readdir(dir));) {
        if (strncmp(e->d_name, prefix, plen) != 0) continue;
        const char *tag = e->d_name + plen;
        const int is_tmp = strncmp(tag, TMP_TAG, strlen(TMP_TAG)) == 0, is_old = strncmp(tag, OLD_TAG, strlen(OLD_TAG)) == 0;
        if (!is_tmp && !is_old) continue;
        const long pid = leftover_pid(tag + strlen(TMP_TAG)); /* both tags have the same length */
        struct stat sb;
        if (!join(path, sizeof path, d.parent, e->d_name)) continue;
        if (!pid || pid_alive(pid) || lstat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        if (is_tmp) {
            if (is_regular(path, FP4RL_DIR_STAGING)) rm_tree(path);
        } else if (is_regular(path, marker)) {
            /* a previous target moved aside by a commit killed before its second rename */
            struct stat tb;
            if (join(buf, sizeof buf, d.parent, d.name) && lstat(buf, &tb) != 0 && errno == ENOENT && rename(path, buf) == 0) fsync_path(d.parent, "fp4rl_dir_recover");
            else rm_tree(path);
        } else {
            rmdir(path); /* an empty target moved aside; anything else stays */
        }
    }
    closedir(dir);
}

fp4rl_status fp4rl_dir_stage(const char *target, const char *marker, char **tmp_out, const char *fn)
{
    dpath d;
    fp4rl_status st = split(target, &d, fn);
    if (st) return st;
    if (!tmp_out) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: tmp_out is NULL", fn);
    *tmp_out = NULL;
    fp4rl_dir_recover(target, marker);
    int exists;
    if ((st = check_target(target, marker, &exists, fn))) return st;
    char *tmp = malloc(PATH_BUF);
    if (!tmp) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    static unsigned counter;
    unsigned long long r = (unsigned long long)ts.tv_nsec * 6364136223846793005ull ^ (unsigned long long)ts.tv_sec;
    for (int attempt = 0;; attempt++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull + __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
        (void)!snprintf(tmp, PATH_BUF, "%s/.%s" TMP_TAG "%ld.%08llx", d.parent, d.name, (long)getpid(), (r >> 24) & 0xffffffffull);
        if (mkdir(tmp, 0777) == 0) break;
        if (errno != EEXIST || attempt == 100) {
            st = fp4rl_fail(FP4RL_ERR_IO, "%s: cannot create a directory next to %s: %s", fn, target, strerror(errno));
            free(tmp);
            return st;
        }
    }
    char note[64];
    snprintf(note, sizeof note, "pid %ld\n", (long)getpid());
    if ((st = write_synced(tmp, FP4RL_DIR_STAGING, note, fn))) {
        fp4rl_dir_abort(tmp);
        return st;
    }
    *tmp_out = tmp;
    return FP4RL_OK;
}

void fp4rl_dir_abort(char *tmp)
{
    if (!tmp) return;
    rm_tree(tmp);
    free(tmp);
}

fp4rl_status fp4rl_dir_mark(const char *dir, const char *marker, const char *fn)
{
    fp4rl_status st = write_synced(dir, marker, "written by fp4rl: this directory is replaced as a whole by the next save to it\n", fn);
    return st ? st : fsync_path(dir, fn);
}

fp4rl_status fp4rl_dir_commit(char *tmp, const char *target, const char *marker, const char *fn)
{
    dpath d;
    fp4rl_status st = split(target, &d, fn);
    if (!st && !tmp) st = fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: no staging directory", fn);
    /* the data first, the marker last: a directory with the marker is complete */
    if (!st && nftw(tmp, sync_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        st = fp4rl_fail(FP4RL_ERR_IO, "%s: cannot fsync the files of %s", fn, tmp);
    if (!st) st = fp4rl_dir_mark(tmp, marker, fn);
    /* the target may have changed since the stage */
    int exists = 0;
    if (!st) st = check_target(target, marker, &exists, fn);
    char aside[PATH_BUF] = "";
    if (!st && exists) {
        const char *tag = strstr(tmp + strlen(d.parent), TMP_TAG);
        (void)!snprintf(aside, sizeof aside, "%s/.%s" OLD_TAG "%s", d.parent, d.name, tag ? tag + strlen(TMP_TAG) : "0.x");
        if (rename(target, aside) != 0)
            st = fp4rl_fail(FP4RL_ERR_IO, "%s: cannot move the previous %s aside: %s", fn, target, strerror(errno));
    }
    if (!st && rename(tmp, target) != 0) {
        st = fp4rl_fail(FP4RL_ERR_IO, "%s: cannot rename %s to %s: %s", fn, tmp, target, strerror(errno));
        if (exists) rename(aside, target); /* put the previous one back */
    }
    if (st) {
        fp4rl_dir_abort(tmp);
        return st;
    }
    free(tmp);
    char path[PATH_BUF];
    if (join(path, sizeof path, target, FP4RL_DIR_STAGING)) unlink(path);
    /* the parent records the renames; the new directory is in place either way, so a failing
     * fsync of the parent is not reported as a failed commit */
    fsync_path(d.parent, fn);
    if (exists) rm_tree(aside);
    return FP4RL_OK;
}
