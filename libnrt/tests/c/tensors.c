/*
 * The rest of the tensor and model API from C: slices (aliases over shared, refcounted
 * memory), empty tensors with an attached caller buffer, memset, copy, the host address and
 * a write through it, the device allocation info and logical core, the dma-buf descriptor
 * (mmap'ed: the same memory), model info and core counts, instance info, memory statistics,
 * nrt_load_collectives and the host collectives with a group of one (a larger group refused),
 * nrt_execute_repeat.
 * Usage: tensors MODEL
 */
#define _DEFAULT_SOURCE
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "nrt/nrt.h"
#include "nrt/nrt_experimental.h"
#include "common.h"

int main(int argc, char **argv) {
    size_t size = 0, n = 0;
    void *bytes;
    nrt_model_t *model = NULL, *group = NULL;
    nrt_tensor_t *big = NULL, *slice = NULL, *out_big = NULL, *out_slice = NULL, *empty = NULL;
    nrt_tensor_t *host = NULL;
    nrt_tensor_set_t *inputs = NULL, *outputs = NULL;
    unsigned char buf[1024], caller[512];
    unsigned char *va, *mapped;
    nrt_tensor_device_allocation_info_t alloc;
    nrt_model_info_t minfo;
    nrt_instance_info_t iinfo;
    nrt_vnc_memory_stats_t before, during, after;
    uint32_t count = 0;
    int lnc = -1, fd = -1, i, device_id = -1;
    uint32_t host_device_id = 7;
    uint64_t dmabuf_offset = 0;

    ASSERT(argc == 2);
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    bytes = read_file(argv[1], &size);

    CHECK(nrt_get_vnc_memory_stats(0, &before, sizeof before, &n));
    ASSERT(n == sizeof before && before.bytes_limit > 0);
    CHECK(nrt_load(bytes, size, 0, -1, &model));
    CHECK(nrt_get_model_info(model, &minfo, sizeof minfo, &n));
    ASSERT(n == sizeof minfo && minfo.vnc == 0);
    CHECK(nrt_get_model_vnc_count(model, &count));
    ASSERT(count == 1);
    CHECK(nrt_get_model_nc_count(model, &count));
    ASSERT(count == 1);
    count = 0;
    CHECK(nrt_get_model_instance_count(model, &count));
    ASSERT(count == 1);
    EXPECT(nrt_get_model_instance_count(model, NULL), NRT_INVALID);
    CHECK(nrt_get_instance_info(&iinfo, sizeof iinfo));
    ASSERT(iinfo.family == NRT_INSTANCE_TRN1 && strcmp(iinfo.arch_name, "trn1") == 0);

    /* A 1024-byte device tensor; the model's input is a 512-byte slice from byte 256. */
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 1024, "big", &big));
    CHECK(nrt_get_vnc_memory_stats(0, &during, sizeof during, &n));
    ASSERT(during.bytes_used >= before.bytes_used + 1024);
    for (i = 0; i < 1024; i++) {
        buf[i] = (unsigned char)(i * 13);
    }
    CHECK(nrt_tensor_write(big, buf, 0, sizeof buf));
    CHECK(nrt_tensor_allocate_slice(big, 256, 512, "slice", &slice));
    ASSERT(nrt_tensor_get_size(slice) == 512);
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 1024, "out_big", &out_big));
    CHECK(nrt_tensor_memset(out_big, 0, 0xA5, 1024));
    CHECK(nrt_tensor_allocate_slice(out_big, 512, 512, "out_slice", &out_slice));
    CHECK(nrt_allocate_tensor_set(&inputs));
    CHECK(nrt_allocate_tensor_set(&outputs));
    CHECK(nrt_add_tensor_to_tensor_set(inputs, "input", slice));
    CHECK(nrt_add_tensor_to_tensor_set(outputs, "output", out_slice));
    nrt_tensor_free(&big); /* the slice keeps the memory */
    CHECK(nrt_execute_repeat(model, inputs, outputs, 1));
    memset(buf, 0, sizeof buf);
    CHECK(nrt_tensor_read(out_big, buf, 0, sizeof buf));
    for (i = 0; i < 512; i++) {
        ASSERT(buf[i] == 0xA5); /* outside the output slice: untouched */
        ASSERT(buf[512 + i] == (unsigned char)((256 + i) * 13));
    }

    /* The host address, the device allocation and the logical core of a slice. */
    va = nrt_tensor_get_va(out_slice);
    ASSERT(va != NULL && va == (unsigned char *)nrt_tensor_get_va(out_big) + 512);
    ASSERT(va[0] == (unsigned char)(256 * 13));
    CHECK(nrt_tensor_get_device_allocation_info(out_slice, &alloc));
    ASSERT(alloc.size >= 1024);
    CHECK(nrt_tensor_get_lnc_index(out_slice, &lnc));
    ASSERT(lnc == 0);
    CHECK(nrt_memcpy_to_device(va + 10, "hello", 5));
    CHECK(nrt_tensor_read(out_slice, buf, 10, 5));
    ASSERT(memcmp(buf, "hello", 5) == 0);
    EXPECT(nrt_memcpy_to_device(va + 510, "hello", 5), NRT_INVALID); /* past the tensor */
    EXPECT(nrt_memcpy_to_device(caller, "hello", 5), NRT_INVALID);   /* not device memory */

    /* The dma-buf descriptor maps the same device memory. */
    EXPECT(nrt_get_dmabuf_fd((uint64_t)(uintptr_t)va, 512, &fd), NRT_INVALID); /* mid-allocation */
    CHECK(nrt_get_dmabuf_fd((uint64_t)(uintptr_t)nrt_tensor_get_va(out_big), 1024, &fd));
    ASSERT(fd >= 0);
    mapped = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT(mapped != MAP_FAILED);
    ASSERT(memcmp(mapped + 522, "hello", 5) == 0);
    mapped[0] = 0x42;
    CHECK(nrt_tensor_read(out_big, buf, 0, 1));
    ASSERT(buf[0] == 0x42);
    munmap(mapped, 4096);
    /* Its size is fixed, as a dma-buf's: cutting it short (which would fault the device's next
     * DMA into it) or growing it is refused, and the memory still works. */
    ASSERT(ftruncate(fd, 0) == -1 && errno == EPERM);
    ASSERT(ftruncate(fd, 1 << 20) == -1 && errno == EPERM);
    close(fd);
    /* v2 takes an address inside the allocation and says where it lies in the memory. */
    CHECK(nrt_get_dmabuf_fd_v2((uint64_t)(uintptr_t)va, 512, &fd, &dmabuf_offset));
    ASSERT(fd >= 0 && dmabuf_offset >= 512);
    mapped = mmap(NULL, (size_t)dmabuf_offset + 512, PROT_READ, MAP_SHARED, fd, 0);
    ASSERT(mapped != MAP_FAILED);
    ASSERT(memcmp(mapped + dmabuf_offset + 10, "hello", 5) == 0);
    munmap(mapped, (size_t)dmabuf_offset + 512);
    close(fd);
    EXPECT(nrt_get_dmabuf_fd_v2((uint64_t)(uintptr_t)va, 513, &fd, &dmabuf_offset), NRT_INVALID);
    EXPECT(nrt_get_dmabuf_fd_v2((uint64_t)(uintptr_t)va, 512, &fd, NULL), NRT_INVALID);
    /* A name is only a label: bytes that are not UTF-8 and names past NRT_TENSOR_NAME_MAX are
     * taken (cut). */
    {
        char long_name[600];
        nrt_tensor_t *labelled = NULL;
        memset(long_name, 'n', sizeof long_name - 1);
        long_name[sizeof long_name - 1] = '\0';
        CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 64, "caf\xe9", &labelled));
        nrt_tensor_free(&labelled);
        CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, 0, 64, long_name, &labelled));
        nrt_tensor_free(&labelled);
    }
    /* No EFA NIC (simdev has no network): a device address is NRT_FAILURE, any other NRT_INVALID;
     * no HBM region is mapped whole: NRT_INVALID. */
    {
        char bdf[32];
        size_t bdf_len = sizeof bdf;
        void *region = NULL;
        size_t region_size = 0;
        EXPECT(nrt_get_attached_efa_bdf(va, bdf, &bdf_len), NRT_FAILURE);
        EXPECT(nrt_get_attached_efa_bdf(bdf, bdf, &bdf_len), NRT_INVALID);
        EXPECT(nrt_get_attached_efa_bdf(va, bdf, NULL), NRT_INVALID);
        EXPECT(nrt_get_hbm_mmap_va(0, 0, &region, &region_size), NRT_INVALID);
        EXPECT(nrt_get_hbm_mmap_va(0, 0, NULL, &region_size), NRT_INVALID);
    }

    /* One device, 0, holds every visible core. */
    CHECK(nrt_get_device_id(0, &device_id));
    ASSERT(device_id == 0);
    EXPECT(nrt_get_device_id(99, &device_id), NRT_INVALID);
    EXPECT(nrt_get_device_id(-1, &device_id), NRT_INVALID);
    CHECK(nrt_host_device_id_get(0, &host_device_id));
    ASSERT(host_device_id == 0);
    EXPECT(nrt_host_device_id_get(1, &host_device_id), NRT_INVALID);
    {
        /* The routing-ID table: one device; too small an array says how many are needed. */
        uint32_t rid_count = 0, rids[4] = {7, 7, 7, 7};
        EXPECT(nrt_host_device_id_rid_map_get(&rid_count, rids), NRT_RESOURCE);
        ASSERT(rid_count == 1 && rids[0] == 7);
        rid_count = 4;
        CHECK(nrt_host_device_id_rid_map_get(&rid_count, rids));
        ASSERT(rid_count == 1 && rids[0] == 0 && rids[1] == 7);
        EXPECT(nrt_host_device_id_rid_map_get(NULL, rids), NRT_INVALID);
        EXPECT(nrt_host_device_id_rid_map_get(&rid_count, NULL), NRT_INVALID);
    }
    {
        /* No NCCL network plugin: NULL, with the reason. */
        int err = 0;
        char why[16];
        ASSERT(nrt_get_libnccl_net(&err, why, sizeof why) == NULL);
        ASSERT(err != 0 && strlen(why) == sizeof why - 1);
        ASSERT(nrt_get_libnccl_net(NULL, NULL, 0) == NULL);
    }

    /* Copy between tensors; an empty tensor with the caller's buffer attached. */
    CHECK(nrt_tensor_allocate_empty("empty", &empty));
    ASSERT(nrt_tensor_get_size(empty) == 0);
    EXPECT(nrt_tensor_read(empty, buf, 0, 1), NRT_INVALID);
    memset(caller, 0, sizeof caller);
    CHECK(nrt_tensor_attach_buffer(empty, caller, sizeof caller));
    ASSERT(nrt_tensor_get_size(empty) == sizeof caller);
    ASSERT(nrt_tensor_get_va(empty) == caller);
    CHECK(nrt_tensor_copy(out_slice, 10, empty, 3, 5));
    ASSERT(memcmp(caller + 3, "hello", 5) == 0);
    /* As a host input of an execution: the identity model copies it to the output. */
    CHECK(nrt_add_tensor_to_tensor_set(inputs, "input", empty));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, 512, "host", &host));
    CHECK(nrt_add_tensor_to_tensor_set(outputs, "output", host));
    CHECK(nrt_execute(model, inputs, outputs));
    CHECK(nrt_tensor_read(host, buf, 0, 8));
    ASSERT(memcmp(buf + 3, "hello", 5) == 0);
    /* Host memory and an attached buffer belong to no logical core: -1 (how nkipy tells a
     * CPU tensor). */
    lnc = 7;
    CHECK(nrt_tensor_get_lnc_index(host, &lnc));
    ASSERT(lnc == -1);
    lnc = 7;
    CHECK(nrt_tensor_get_lnc_index(empty, &lnc));
    ASSERT(lnc == -1);
    /* Another buffer attached to the same tensor: the next execution reads it. */
    memset(buf, 0x77, 512);
    CHECK(nrt_tensor_attach_buffer(empty, buf, 512));
    CHECK(nrt_execute(model, inputs, outputs));
    CHECK(nrt_tensor_read(host, caller, 0, 8));
    ASSERT(caller[0] == 0x77 && caller[7] == 0x77);

    /* Host collectives: a group of one (rank 0, a visible core) succeeds, the gather copies the
     * rank's input; another rank, a larger group or a core not visible is refused. */
    CHECK(nrt_build_global_comm(0, 0, 1));
    CHECK(nrt_cc_global_comm_init(0, 0, 1));
    EXPECT(nrt_build_global_comm(0, 0, 2), NRT_INVALID);
    EXPECT(nrt_build_global_comm(0, 1, 1), NRT_INVALID);
    EXPECT(nrt_build_global_comm(-1, 0, 1), NRT_INVALID);
    EXPECT(nrt_cc_global_comm_init(99, 0, 1), NRT_INVALID);
    CHECK(nrt_barrier(0, 0, 1));
    EXPECT(nrt_barrier(0, 0, 8), NRT_INVALID);
    EXPECT(nrt_barrier(0, 1, 1), NRT_INVALID); /* rank 1 is not in a group of 1 */
    EXPECT(nrt_barrier(0, 0, 0), NRT_INVALID); /* no ranks */
    memset(caller, 0, sizeof caller);
    for (i = 0; i < 64; i++) {
        buf[i] = (unsigned char)(255 - i);
    }
    CHECK(nrt_all_gather(0, 0, 1, 64, buf, caller));
    ASSERT(memcmp(caller, buf, 64) == 0 && caller[64] == 0);
    EXPECT(nrt_all_gather(0, 0, 2, 64, buf, caller), NRT_INVALID);
    EXPECT(nrt_all_gather(0, 0, 1, 64, NULL, caller), NRT_INVALID);
    EXPECT(nrt_all_gather(0, 0, 1, 64, buf, NULL), NRT_INVALID);
    CHECK(nrt_all_gather(0, 0, 1, 0, NULL, NULL));

    /* nrt_load_collectives: a group of one loads, a larger one is refused. */
    EXPECT(nrt_load_collectives(bytes, size, 0, -1, 1, 4, &group), NRT_INVALID);
    CHECK(nrt_load_collectives(bytes, size, 0, -1, 0, 1, &group));
    CHECK(nrt_unload(group));

    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    nrt_tensor_free(&slice);
    nrt_tensor_free(&out_slice);
    nrt_tensor_free(&out_big);
    nrt_tensor_free(&empty);
    nrt_tensor_free(&host);
    CHECK(nrt_unload(model));
    CHECK(nrt_get_vnc_memory_stats(0, &after, sizeof after, &n));
    ASSERT(after.bytes_used == before.bytes_used);
    nrt_close();
    free(bytes);
    printf("TENSORS OK\n");
    return 0;
}
