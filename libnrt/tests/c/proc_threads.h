/*
 * The threads of a C test program, for checking that libnrt leaves none running after
 * nrt_close. Needs POSIX 2008 (define _POSIX_C_SOURCE or _GNU_SOURCE before any include).
 */
#ifndef LIBNRT_TEST_PROC_THREADS_H
#define LIBNRT_TEST_PROC_THREADS_H

#include <dirent.h>
#include <stdio.h>
#include <time.h>

/* The threads of this process, from /proc/self/task; with `say`, their names on stderr. */
static inline int threads(int say) {
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;
    if (d == NULL) {
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') {
            continue;
        }
        n++;
        if (say) {
            char path[300], name[64] = "";
            FILE *f;
            snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
            f = fopen(path, "r");
            if (f) {
                if (!fgets(name, sizeof name, f)) {
                    name[0] = 0;
                }
                fclose(f);
            }
            fprintf(stderr, "thread %s: %s", e->d_name, name);
        }
    }
    closedir(d);
    return n;
}

/* Whether this process is down to its one thread within 2 s: a thread joined a moment ago
 * may still be listed while the kernel finishes its exit; a thread left running never goes.
 * When not, the threads left are named on stderr. */
static inline int alone(void) {
    struct timespec pause = {0, 10 * 1000 * 1000};
    int i;
    for (i = 0; i < 200; i++) {
        if (threads(0) == 1) {
            return 1;
        }
        nanosleep(&pause, NULL);
    }
    threads(1);
    return 0;
}

#endif
