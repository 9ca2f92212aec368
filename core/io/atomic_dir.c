/* atomic_dir.c - a directory written atomically (see atomic_dir.h; minimal version, see there). */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/atomic_dir.h"

/* parent folder ("." when none) and base name of path, without trailing slashes. */
static int split(const char *path, char *parent, size_t pcap, char *base, size_t bcap)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s", path) >= sizeof tmp) return -1;
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/') tmp[--n] = 0;
    char *s = strrchr(tmp, '/');
    const char *b = s ? s + 1 : tmp;
    if (!*b || strcmp(b, ".") == 0 || strcmp(b, "..") == 0) return -1;
    if (s == tmp) snprintf(parent, pcap, "/");
    else if (s) snprintf(parent, pcap, "%.*s", (int)(s - tmp), tmp);
    else snprintf(parent, pcap, ".");
    snprintf(base, bcap, "%s", b);
    return 0;
}

static fp4rl_status sync_path(const char *p, int dir)
{
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK | (dir ? O_DIRECTORY : 0));
    if (fd < 0) return FP4RL_ERR_IO;
    int r = fsync(fd);
    close(fd);
    return r == 0 ? FP4RL_OK : FP4RL_ERR_IO;
}

/* Removes the regular files of a flat directory we wrote, then the directory. */
static void remove_flat(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4352];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(dir);
}

fp4rl_status fp4rl_dir_stage(const char *target, const char *marker, char **tmp_out, const char *fn)
{
    char parent[4096], base[1024], p[5200];
    if (!target || !marker || !tmp_out || split(target, parent, sizeof parent, base, sizeof base))
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: '%.300s' is not a directory path to write", fn, target ? target : "(null)");
    struct stat sb;
    if (lstat(target, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: '%.300s' exists and is not a directory; refusing to replace it", fn, target);
        snprintf(p, sizeof p, "%s/%s", target, marker);
        struct stat mb;
        if (!(lstat(p, &mb) == 0 && S_ISREG(mb.st_mode))) {
            DIR *d = opendir(target);
            int empty = d != NULL;
            for (struct dirent *e; d && (e = readdir(d));) empty &= !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
            if (d) closedir(d);
            if (!empty)
                return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: '%.300s' is a directory that fp4rl did not write (no %s); refusing to replace it",
                                  fn, target, marker);
        }
    } else if (errno != ENOENT) {
        return fp4rl_fail(FP4RL_ERR_IO, "%s: cannot inspect '%.300s': %s", fn, target, strerror(errno));
    }
    static unsigned counter;
    for (int tries = 0; tries < 100; tries++) {
        snprintf(p, sizeof p, "%s/.%s.fp4rl-tmp.%ld.%u", parent, base, (long)getpid(), __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
        if (mkdir(p, 0777) == 0) {
            *tmp_out = strdup(p);
            if (*tmp_out) return FP4RL_OK;
            rmdir(p);
            return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        }
        if (errno != EEXIST) break;
    }
    return fp4rl_fail(FP4RL_ERR_IO, "%s: cannot create a staging directory next to '%.300s': %s", fn, target, strerror(errno));
}

fp4rl_status fp4rl_dir_commit(char *tmp, const char *target, const char *marker, const char *fn)
{
    char parent[4096], base[1024], p[5200], old[5200];
    fp4rl_status st = FP4RL_OK;
    if (!tmp || !target || !marker || split(target, parent, sizeof parent, base, sizeof base)) {
        fp4rl_dir_abort(tmp);
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: bad commit arguments", fn);
    }
    DIR *d = opendir(tmp);
    for (struct dirent *e; !st && d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", tmp, e->d_name);
            if (sync_path(p, 0)) st = fp4rl_fail(FP4RL_ERR_IO, "%s: cannot fsync '%.300s': %s", fn, p, strerror(errno));
        }
    if (d) closedir(d);
    else st = fp4rl_fail(FP4RL_ERR_IO, "%s: cannot list '%.300s': %s", fn, tmp, strerror(errno));
    snprintf(p, sizeof p, "%s/%s", tmp, marker);
    FILE *mf = st ? NULL : fopen(p, "wx");
    if (!st && (!mf || fputs("fp4rl\n", mf) < 0 || fclose(mf) != 0 || sync_path(p, 0) || sync_path(tmp, 1)))
        st = fp4rl_fail(FP4RL_ERR_IO, "%s: cannot write '%.300s': %s", fn, p, strerror(errno));
    int moved = 0;
    struct stat sb;
    if (!st && lstat(target, &sb) == 0) {
        snprintf(old, sizeof old, "%s/.%s.fp4rl-old.%ld", parent, base, (long)getpid());
        if (rename(target, old) != 0) st = fp4rl_fail(FP4RL_ERR_IO, "%s: cannot move '%.300s' aside: %s", fn, target, strerror(errno));
        else moved = 1;
    }
    if (!st && rename(tmp, target) != 0) {
        st = fp4rl_fail(FP4RL_ERR_IO, "%s: cannot rename '%.300s' to '%.300s': %s", fn, tmp, target, strerror(errno));
        if (moved) rename(old, target);
        moved = 0;
    }
    if (st) {
        fp4rl_dir_abort(tmp);
        return st;
    }
    sync_path(parent, 1);
    if (moved) remove_flat(old);
    free(tmp);
    return FP4RL_OK;
}

void fp4rl_dir_abort(char *tmp)
{
    if (!tmp) return;
    remove_flat(tmp);
    free(tmp);
}
