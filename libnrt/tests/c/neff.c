/*
 * A real NEFF through the C API as a framework would drive it: nrt_load of the file's bytes,
 * the model's inputs and outputs discovered with nrt_get_model_tensor_info (names, FLOAT16,
 * shapes, sizes), one device tensor each, inputs filled, nrt_execute, the output read back.
 * simdev runs NEFFs shape-only, so the output is checked against the documented shape-only
 * function of the inputs (shared::neff_program::shape_only), written out again here in C; with
 * a reference bound (NEURON_SIMDEV_REFERENCE=...=ref_matmul.py:matmul) simdev computes the real
 * numbers, and the output is checked against x @ y computed here from the float16 inputs.
 * Usage: neff FILE.neff EXECUTIONS shape-only|matmul [async]
 *        (env: NEURON_SIMDEV_ARCH=trn2 NEURON_LOGICAL_NC_CONFIG=2)
 * With `async` each execution is scheduled with nrta_execute_schedule and polled to completion
 * with nrta_is_completed; a failed one's ret is reported as nrt_execute's would be.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nrt/nrt.h"
#include "nrt/nrt_async.h"
#include "nrt/nrt_experimental.h"
#include "common.h"

/* One execution: nrt_execute, or (async) scheduled and polled to completion. */
static NRT_STATUS execute(nrt_model_t *model, nrt_tensor_set_t *inputs,
                          nrt_tensor_set_t *outputs, int async) {
    NRT_STATUS ret = NRT_FAILURE;
    nrta_seq_t seq;
    bool done = false;
    if (!async) {
        return nrt_execute(model, inputs, outputs);
    }
    CHECK(nrta_execute_schedule(model, inputs, outputs, 0, &ret, &seq));
    while (!done) {
        CHECK(nrta_is_completed(seq, &done));
    }
    return ret;
}

#define EDGE 4096u
#define MAX_IO 8

static uint64_t splitmix64(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Word-wise FNV-1a: 8-byte little-endian words, the last zero-padded. */
static uint64_t fnv(uint64_t h, const unsigned char *p, size_t n) {
    size_t i, k;
    for (i = 0; i < n; i += 8) {
        uint64_t w = 0;
        for (k = 0; k < 8 && i + k < n; k++) {
            w |= (uint64_t)p[i + k] << (8 * k);
        }
        h = (h ^ w) * 0x100000001b3ull;
    }
    return h;
}

/* IEEE half (little-endian bytes at p) to float. */
static float half_at(const unsigned char *p) {
    unsigned h = (unsigned)p[0] | (unsigned)p[1] << 8;
    unsigned sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v;
    if (e == 0) {
        v = (float)m / 1024.0f / 16384.0f; /* subnormal: m * 2^-24 */
    } else if (e == 31) {
        v = m ? 0.0f / 0.0f : 1.0f / 0.0f;
    } else {
        v = (1.0f + (float)m / 1024.0f) * (float)(1u << e) / 32768.0f; /* 2^(e-15) */
    }
    return sign ? -v : v;
}

/* A float in [-2, 2) as IEEE half (exact for these: 8 fraction bits). */
static void half_of(float f, unsigned char *p) {
    unsigned sign = f < 0, e = 15, m;
    float a = sign ? -f : f;
    if (a < 1.0f / 16384.0f) {
        p[0] = 0;
        p[1] = (unsigned char)(sign << 7);
        return;
    }
    while (a >= 2.0f) {
        a /= 2.0f;
        e++;
    }
    while (a < 1.0f) {
        a *= 2.0f;
        e--;
    }
    m = (unsigned)((a - 1.0f) * 1024.0f);
    p[0] = (unsigned char)(m & 0xff);
    p[1] = (unsigned char)(sign << 7 | e << 2 | m >> 8);
}

/* Byte o of the stream seeded `stream`. */
static unsigned char stream_byte(uint64_t stream, uint64_t o) {
    return (unsigned char)(splitmix64(stream + o / 8) >> (8 * (o % 8)));
}

int main(int argc, char **argv) {
    size_t size = 0, i;
    void *bytes;
    nrt_model_t *model = NULL;
    nrt_tensor_info_array_t *info = NULL;
    nrt_tensor_t *tensors[MAX_IO];
    unsigned char *buffers[MAX_IO];
    nrt_tensor_set_t *inputs = NULL, *outputs = NULL;
    long executions, e;
    uint64_t n_io;
    int matmul;

    ASSERT(argc == 4 || (argc == 5 && strcmp(argv[4], "async") == 0));
    executions = atol(argv[2]);
    matmul = strcmp(argv[3], "matmul") == 0;
    ASSERT(matmul || strcmp(argv[3], "shape-only") == 0);
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    bytes = read_file(argv[1], &size);
    /* NEURON_RT_VALIDATE_HASH and NEURON_RT_EXEC_TIMEOUT are read at load, not at init: set
     * after nrt_init, a hash check refuses a NEFF whose payload changed and a malformed timeout
     * is named. */
    {
        unsigned char *changed = malloc(size);
        nrt_model_t *refused = NULL;
        ASSERT(changed != NULL && size > 0xAC);
        memcpy(changed, bytes, size);
        changed[0xAC] ^= 1;
        ASSERT(setenv("NEURON_RT_VALIDATE_HASH", "1", 1) == 0);
        EXPECT(nrt_load(changed, size, 0, -1, &refused), NRT_INVALID);
        ASSERT(refused == NULL);
        ASSERT(unsetenv("NEURON_RT_VALIDATE_HASH") == 0);
        ASSERT(setenv("NEURON_RT_EXEC_TIMEOUT", "soon", 1) == 0);
        EXPECT(nrt_load(bytes, size, 0, -1, &refused), NRT_INVALID);
        ASSERT(unsetenv("NEURON_RT_EXEC_TIMEOUT") == 0);
        free(changed);
    }
    CHECK(nrt_load(bytes, size, 0, -1, &model));
    CHECK(nrt_get_model_tensor_info(model, &info));
    n_io = info->tensor_count;
    ASSERT(n_io == 3 && n_io <= MAX_IO);
    CHECK(nrt_allocate_tensor_set(&inputs));
    CHECK(nrt_allocate_tensor_set(&outputs));
    for (i = 0; i < n_io; i++) {
        nrt_tensor_info_t *t = &info->tensor_array[i];
        uint64_t elems = 1;
        uint32_t d;
        ASSERT(t->dtype == NRT_DTYPE_FLOAT16);
        for (d = 0; d < t->ndim; d++) {
            elems *= t->shape[d];
        }
        ASSERT(elems * 2 == t->size);
        printf("%s %s dtype %d shape", t->usage == NRT_TENSOR_USAGE_INPUT ? "input" : "output",
               t->name, (int)t->dtype);
        for (d = 0; d < t->ndim; d++) {
            printf("%s%u", d ? "x" : " ", t->shape[d]);
        }
        printf(" bytes %zu\n", t->size);
        CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, t->size, t->name, &tensors[i]));
        buffers[i] = malloc(t->size);
        ASSERT(buffers[i] != NULL);
        CHECK(nrt_add_tensor_to_tensor_set(
            t->usage == NRT_TENSOR_USAGE_INPUT ? inputs : outputs, t->name, tensors[i]));
    }
    /* matmul_small: inputs x, y (the DGE table's order), output output0. */
    ASSERT(strcmp(info->tensor_array[0].name, "x") == 0);
    ASSERT(strcmp(info->tensor_array[1].name, "y") == 0);
    ASSERT(strcmp(info->tensor_array[2].name, "output0") == 0);
    for (e = 0; e < executions; e++) {
        uint64_t seed = 0xcbf29ce484222325ull, stream;
        size_t bad = 0;
        for (i = 0; i < 2; i++) {
            size_t n = info->tensor_array[i].size, j, edge = n < EDGE ? n : EDGE;
            unsigned char le[8];
            int k;
            for (j = 0; j + 1 < n; j += 2) {
                /* Values in [-2, 2) with 8 fraction bits: exact in float16. */
                int q = (int)((j / 2 * 37 + (size_t)e * 11 + i * 101) % 1024) - 512;
                half_of((float)q / 256.0f, &buffers[i][j]);
            }
            CHECK(nrt_tensor_write(tensors[i], buffers[i], 0, n));
            for (k = 0; k < 8; k++) {
                le[k] = (unsigned char)((uint64_t)n >> (8 * k));
            }
            seed = fnv(seed, le, 8);
            seed = fnv(seed, buffers[i], edge);
            seed = fnv(seed, buffers[i] + n - edge, edge);
        }
        CHECK(execute(model, inputs, outputs, argc == 5));
        CHECK(nrt_tensor_read(tensors[2], buffers[2], 0, info->tensor_array[2].size));
        if (matmul) {
            /* output0[128,128] = x[128,256] @ y[256,128]: within float16's rounding. */
            size_t r, c, k;
            for (r = 0; r < 128; r++) {
                for (c = 0; c < 128; c++) {
                    float want = 0.0f, got, a, tol;
                    for (k = 0; k < 256; k++) {
                        want += half_at(&buffers[0][(r * 256 + k) * 2]) *
                                half_at(&buffers[1][(k * 128 + c) * 2]);
                    }
                    got = half_at(&buffers[2][(r * 128 + c) * 2]);
                    a = want < 0 ? -want : want;
                    tol = 1e-3f * a + (a > 1.0f ? a : 1.0f) / 2048.0f;
                    bad += (got - want > tol || want - got > tol);
                }
            }
        } else {
            stream = splitmix64(seed ^ 0x9E3779B97F4A7C15ull);
            for (i = 0; i < info->tensor_array[2].size; i++) {
                bad += buffers[2][i] != stream_byte(stream, i);
            }
        }
        ASSERT(bad == 0);
    }
    printf("neff executions %ld outputs %s-checked\n", executions, argv[3]);
    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    for (i = 0; i < n_io; i++) {
        nrt_tensor_free(&tensors[i]);
        free(buffers[i]);
    }
    CHECK(nrt_free_model_tensor_info(info));
    CHECK(nrt_unload(model));
    free(bytes);
    nrt_close();
    return 0;
}
