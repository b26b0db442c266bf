/* Pinned host buffers (nrt.h, runtime 2.34.10): every type gives writable memory of the size
 * asked, aligned to its page, usable as a tensor's attached buffer; bad arguments give NULL;
 * a freed buffer is unmapped; freeing NULL, a foreign pointer or a buffer twice does nothing
 * harmful. No nrt_init needed to allocate. */
#include <stdint.h>
#include <string.h>

#include <nrt/nrt.h>

#include "common.h"

/* Whether `p` lies in a mapping of this process (/proc/self/maps: no syscall on `p`, which a
 * memory checker would report). */
static int mapped(const void *p) {
    FILE *f = fopen("/proc/self/maps", "r");
    unsigned long start, end;
    char line[512];
    int found = 0;
    ASSERT(f != NULL);
    while (!found && fgets(line, sizeof line, f)) {
        if (sscanf(line, "%lx-%lx", &start, &end) == 2)
            found = (uintptr_t)p >= start && (uintptr_t)p < end;
    }
    fclose(f);
    return found;
}

static void fill_and_check(unsigned char *p, size_t size, unsigned char seed) {
    for (size_t i = 0; i < size; i++) p[i] = (unsigned char)(seed + i * 7);
    for (size_t i = 0; i < size; i++) ASSERT(p[i] == (unsigned char)(seed + i * 7));
}

int main(int argc, char **argv) {
    const size_t sizes[] = {1, 4096, 5000, (3u << 20) + 17};
    const size_t align[] = {4096, 2u << 20};
    int stack_value = 0;
    (void)argc;
    (void)argv;

    /* Before nrt_init. */
    for (int type = NRT_PINNED_ALLOC_TYPE_MALLOC; type <= NRT_PINNED_ALLOC_TYPE_HUGEPAGE_2M;
         type++) {
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            unsigned char *p = nrt_pinned_malloc(sizes[i], (nrt_pinned_alloc_type_t)type);
            ASSERT(p != NULL && mapped(p));
            ASSERT((uintptr_t)p % align[type] == 0);
            fill_and_check(p, sizes[i], (unsigned char)(type * 31 + i));
            nrt_pinned_free(p);
            /* Unmapped (nothing else maps memory here: the runtime is not initialised). */
            ASSERT(!mapped(p));
        }
    }
    ASSERT(nrt_pinned_malloc(0, NRT_PINNED_ALLOC_TYPE_MALLOC) == NULL);
    ASSERT(nrt_pinned_malloc(64, (nrt_pinned_alloc_type_t)7) == NULL);
    ASSERT(nrt_pinned_malloc(SIZE_MAX, NRT_PINNED_ALLOC_TYPE_MALLOC) == NULL);
    ASSERT(nrt_pinned_malloc(SIZE_MAX - 100, NRT_PINNED_ALLOC_TYPE_HUGEPAGE_2M) == NULL);
    nrt_pinned_free(NULL);
    nrt_pinned_free(&stack_value);
    ASSERT(stack_value == 0);

    /* A pinned buffer as a host tensor's storage, through a write and a read. */
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    {
        const size_t size = 1u << 20;
        unsigned char *buf = nrt_pinned_malloc(size, NRT_PINNED_ALLOC_TYPE_HUGEPAGE_2M);
        unsigned char *out = malloc(size);
        nrt_tensor_t *t = NULL;
        ASSERT(buf != NULL && out != NULL);
        CHECK(nrt_tensor_allocate_empty("pinned", &t));
        CHECK(nrt_tensor_attach_buffer(t, buf, size));
        memset(out, 0x5A, size);
        CHECK(nrt_tensor_write(t, out, 0, size));
        ASSERT(buf[0] == 0x5A && buf[size - 1] == 0x5A);
        memset(out, 0, size);
        CHECK(nrt_tensor_read(t, out, 0, size));
        ASSERT(out[size / 2] == 0x5A);
        nrt_tensor_free(&t);
        nrt_pinned_free(buf);
        /* Freed twice: logged, nothing else. */
        nrt_pinned_free(buf);
        free(out);
    }
    nrt_close();
    printf("PINNED OK\n");
    return 0;
}
