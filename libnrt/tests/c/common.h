/* Helpers shared by the C test programs: checked calls and reading a model file. */
#ifndef LIBNRT_TEST_COMMON_H
#define LIBNRT_TEST_COMMON_H

#include <stdio.h>
#include <stdlib.h>

/* Fails the program unless `call` returns `expected`, naming the call and the status. */
#define EXPECT(call, expected)                                                            \
    do {                                                                                  \
        NRT_STATUS s_ = (call);                                                           \
        if (s_ != (expected)) {                                                           \
            fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d\n", __FILE__,        \
                    __LINE__, #call, (int)s_, nrt_get_status_as_str(s_), (int)(expected)); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

#define CHECK(call) EXPECT(call, NRT_SUCCESS)

/* Fails the program unless `cond` holds. */
#define ASSERT(cond)                                                                      \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #cond);   \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

/* The whole of `path` in a malloc'd buffer; its size in `*size`. */
static inline void *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    long len;
    void *buf;
    if (!f) {
        perror(path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)len);
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        fprintf(stderr, "%s: cannot read\n", path);
        exit(1);
    }
    fclose(f);
    *size = (size_t)len;
    return buf;
}

#endif
