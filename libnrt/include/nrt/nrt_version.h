/*
 * nrt/nrt_version.h - the library version, size-versioned.
 *
 * Written for this project from the public facts of libnrt's API.
 */
#ifndef NRT_NRT_VERSION_H
#define NRT_NRT_VERSION_H

#include <stddef.h>
#include <stdint.h>
#include "nrt/nrt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Length of nrt_version_t::rt_detail. */
#define NRT_VERSION_DETAIL_LEN 128
/** Length of nrt_version_t::git_hash. */
#define NRT_VERSION_GIT_HASH_LEN 64

/** The runtime library's version (224 bytes; fields are only ever appended). */
typedef struct nrt_version {
    uint64_t rt_major;                          /**< Major version. */
    uint64_t rt_minor;                          /**< Minor version. */
    uint64_t rt_patch;                          /**< Patch level. */
    uint64_t rt_maintenance;                    /**< Maintenance level. */
    char rt_detail[NRT_VERSION_DETAIL_LEN];     /**< Free text, NUL-terminated. */
    char git_hash[NRT_VERSION_GIT_HASH_LEN];    /**< Source revision, NUL-terminated. */
} nrt_version_t;

/**
 * Fills `ver` with the library version, writing at most `size` bytes (pass sizeof(nrt_version_t)).
 * Callable before nrt_init.
 */
NRT_STATUS nrt_get_version(nrt_version_t *ver, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* NRT_NRT_VERSION_H */
