/*
 * Every status gate from C: before nrt_init 13, after nrt_close 14; NULL arguments, bad names,
 * sizes, placements and cores NRT_INVALID; freed, foreign and mistyped handles NRT_INVALID
 * (never dereferenced); a tensor-set lookup miss NRT_FAILURE with no write; and the calls that
 * work before nrt_init; the debug stream refused, with no output written. Usage: gates MODEL
 */
#include <stdint.h>
#include <string.h>

#include "nrt/ndebug_stream.h"
#include "nrt/nrt.h"
#include "nrt/nrt_experimental.h"
#include "common.h"

int main(int argc, char **argv) {
    size_t model_size = 0;
    void *model_bytes;
    nrt_model_t *model = NULL, *stale_model;
    nrt_tensor_t *in = NULL, *out = NULL, *freed, *small = NULL, *other = NULL;
    nrt_tensor_set_t *inputs = NULL, *outputs = NULL, *bad_set = NULL;
    nrt_tensor_info_array_t *info = NULL;
    nrt_version_t ver;
    uint32_t count = 0;
    uint64_t foreign[8] = {0};
    char long_name[300];
    unsigned char buf[512];
    nrt_tensor_t *sentinel = (nrt_tensor_t *)&foreign[1];
    nrt_tensor_t *looked_up = sentinel;
    nrt_vnc_memory_stats_t stats;
    size_t stats_size = 0;
    int stream_fd = -7;
    ndebug_stream_event_header_t event_header;
    void *event_payload = sentinel;

    ASSERT(argc == 2);
    model_bytes = read_file(argv[1], &model_size);
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';

    /* Before nrt_init: 13, except the calls that work before it. */
    EXPECT(nrt_load(model_bytes, model_size, 0, -1, &model), NRT_UNINITIALIZED);
    EXPECT(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, 8, "t", &in), NRT_UNINITIALIZED);
    EXPECT(nrt_allocate_tensor_set(&inputs), NRT_UNINITIALIZED);
    EXPECT(nrt_execute(model, inputs, outputs), NRT_UNINITIALIZED);
    EXPECT(nrt_get_vnc_memory_stats(0, &stats, sizeof stats, &stats_size), NRT_UNINITIALIZED);
    EXPECT(nrt_debug_client_connect(0, &stream_fd), NRT_UNINITIALIZED);
    CHECK(nrt_get_version(&ver, sizeof ver));
    ASSERT(ver.rt_major == NRT_MAJOR_VERSION);
    /* The API level of the headers (2.34.10): a framework gating the async 3.x API on
     * runtime >= 2.31 finds it. */
    ASSERT(ver.rt_minor == 34 && ver.rt_patch == 10 && ver.rt_maintenance == 0);
    ASSERT(strstr(ver.rt_detail, "not AWS") != NULL);
    CHECK(nrt_get_total_vnc_count(&count));
    ASSERT(count >= 1);
    CHECK(nrt_get_visible_nc_count(&count));
    ASSERT(count >= 1);
    EXPECT(nrt_get_total_nc_count(NULL), NRT_INVALID);
    ASSERT(strcmp(nrt_get_status_as_str(NRT_CLOSED), "NRT_CLOSED") == 0);

    EXPECT(nrt_init((nrt_framework_type_t)99, "", ""), NRT_INVALID);
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    ASSERT(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", "") != NRT_SUCCESS);

    /* The debug stream: arguments checked, then refused (no events exist), nothing written. */
    EXPECT(nrt_debug_client_connect(0, NULL), NRT_INVALID);
    EXPECT(nrt_debug_client_connect(99, &stream_fd), NRT_INVALID);
    EXPECT(nrt_debug_client_connect(-1, &stream_fd), NRT_INVALID);
    EXPECT(nrt_debug_client_connect(0, &stream_fd), NRT_INVALID);
    ASSERT(stream_fd == -7);
    memset(&event_header, 0xEE, sizeof event_header);
    EXPECT(nrt_debug_client_read_one_event(3, NULL, &event_payload), NRT_INVALID);
    EXPECT(nrt_debug_client_read_one_event(3, &event_header, NULL), NRT_INVALID);
    EXPECT(nrt_debug_client_read_one_event(3, &event_header, &event_payload), NRT_INVALID);
    ASSERT(event_payload == sentinel && event_header.data_size == 0xEEEEEEEEEEEEEEEEULL);
    nrt_debug_client_connect_close(3);

    /* NULL arguments. */
    EXPECT(nrt_load(NULL, model_size, 0, -1, &model), NRT_INVALID);
    EXPECT(nrt_load(model_bytes, model_size, 0, -1, NULL), NRT_INVALID);
    EXPECT(nrt_load(model_bytes, 0, 0, -1, &model), NRT_INVALID);
    EXPECT(nrt_load(model_bytes, model_size / 2, 0, -1, &model), NRT_INVALID);
    EXPECT(nrt_load(model_bytes, model_size, 42, -1, &model), NRT_INVALID);
    EXPECT(nrt_load(model_bytes, model_size, -5, -1, &model), NRT_INVALID);
    CHECK(nrt_load(model_bytes, model_size, 0, -1, &model));
    EXPECT(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 512, "in", NULL), NRT_INVALID);
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 512, "in", &in));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 512, NULL, &out));
    EXPECT(nrt_tensor_read(in, NULL, 0, 4), NRT_INVALID);
    EXPECT(nrt_tensor_write(in, NULL, 0, 4), NRT_INVALID);
    EXPECT(nrt_tensor_read(NULL, buf, 0, 4), NRT_INVALID);
    EXPECT(nrt_get_model_tensor_info(model, NULL), NRT_INVALID);
    EXPECT(nrt_get_model_tensor_info(NULL, &info), NRT_INVALID);
    EXPECT(nrt_allocate_tensor_set(NULL), NRT_INVALID);
    CHECK(nrt_allocate_tensor_set(&inputs));
    CHECK(nrt_allocate_tensor_set(&outputs));
    EXPECT(nrt_add_tensor_to_tensor_set(inputs, NULL, in), NRT_INVALID);
    EXPECT(nrt_add_tensor_to_tensor_set(NULL, "input", in), NRT_INVALID);
    EXPECT(nrt_add_tensor_to_tensor_set(inputs, "input", NULL), NRT_INVALID);
    EXPECT(nrt_execute(model, NULL, outputs), NRT_INVALID);
    EXPECT(nrt_execute(NULL, inputs, outputs), NRT_INVALID);
    EXPECT(nrt_get_vnc_memory_stats(0, NULL, sizeof stats, &stats_size), NRT_INVALID);
    EXPECT(nrt_get_dmabuf_fd(0, 8, NULL), NRT_INVALID);
    EXPECT(nrt_memcpy_to_device(NULL, buf, 8), NRT_INVALID);
    ASSERT(nrt_tensor_get_va(NULL) == NULL);
    ASSERT(nrt_tensor_get_size(NULL) == 0);
    nrt_tensor_free(NULL);
    nrt_destroy_tensor_set(NULL);

    /* Bad names, sizes, placements, cores. */
    /* A tensor's name is a label, cut to NRT_TENSOR_NAME_MAX - 1; an I/O name must match. */
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, 8, long_name, &small));
    nrt_tensor_free(&small);
    EXPECT(nrt_add_tensor_to_tensor_set(inputs, long_name, in), NRT_INVALID);
    EXPECT(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, 0, "empty", &small), NRT_INVALID);
    EXPECT(nrt_tensor_allocate((nrt_tensor_placement_t)7, 0, 8, "p", &small), NRT_INVALID);
    EXPECT(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 99, 8, "far", &small), NRT_INVALID);
    EXPECT(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, -1, 8, "none", &small), NRT_INVALID);
    EXPECT(nrt_tensor_read(in, buf, 500, 13), NRT_INVALID);
    EXPECT(nrt_tensor_write(in, buf, (size_t)-1, 2), NRT_INVALID);
    EXPECT(nrt_tensor_memset(in, 510, 0, 3), NRT_INVALID);
    EXPECT(nrt_tensor_copy(in, 0, out, 1, 512), NRT_INVALID);
    EXPECT(nrt_tensor_allocate_slice(in, 500, 13, "s", &small), NRT_INVALID);
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 256, "small", &small));
    CHECK(nrt_add_tensor_to_tensor_set(inputs, "input", small));
    CHECK(nrt_add_tensor_to_tensor_set(outputs, "output", out));
    EXPECT(nrt_execute(model, inputs, outputs), NRT_INVALID); /* wrong size */
    CHECK(nrt_add_tensor_to_tensor_set(inputs, "input", in)); /* replaces */
    CHECK(nrt_add_tensor_to_tensor_set(inputs, "extra", small));
    EXPECT(nrt_execute(model, inputs, outputs), NRT_INVALID); /* one input too many */
    CHECK(nrt_allocate_tensor_set(&bad_set));
    CHECK(nrt_add_tensor_to_tensor_set(bad_set, "not_an_input", in));
    EXPECT(nrt_execute(model, bad_set, outputs), NRT_INVALID); /* unknown name */
    EXPECT(nrt_execute_repeat(model, bad_set, outputs, 2), NRT_INVALID);

    /* The good execution still works after all that, and nothing was lost. */
    nrt_destroy_tensor_set(&inputs);
    CHECK(nrt_allocate_tensor_set(&inputs));
    CHECK(nrt_add_tensor_to_tensor_set(inputs, "input", in));
    memset(buf, 0x5A, sizeof buf);
    CHECK(nrt_tensor_write(in, buf, 0, sizeof buf));
    CHECK(nrt_execute(model, inputs, outputs));
    memset(buf, 0, sizeof buf);
    CHECK(nrt_tensor_read(out, buf, 0, sizeof buf));
    ASSERT(buf[0] == 0x5A && buf[511] == 0x5A);

    /* Tensor-set lookup miss: NRT_FAILURE, the out-pointer untouched. */
    EXPECT(nrt_get_tensor_from_tensor_set(inputs, "nope", &looked_up), NRT_FAILURE);
    ASSERT(looked_up == sentinel);
    CHECK(nrt_get_tensor_from_tensor_set(inputs, "input", &looked_up));
    ASSERT(looked_up == in);

    /* Freed, foreign and mistyped handles. */
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, 16, "other", &other));
    freed = other;
    nrt_tensor_free(&other);
    ASSERT(other == NULL);
    EXPECT(nrt_tensor_read(freed, buf, 0, 4), NRT_INVALID);
    EXPECT(nrt_tensor_write(freed, buf, 0, 4), NRT_INVALID);
    EXPECT(nrt_add_tensor_to_tensor_set(inputs, "input", freed), NRT_INVALID);
    nrt_tensor_free(&freed); /* a second free: refused, logged, nothing happens */
    ASSERT(freed != NULL);
    EXPECT(nrt_tensor_read((nrt_tensor_t *)foreign, buf, 0, 4), NRT_INVALID);
    EXPECT(nrt_tensor_write((nrt_tensor_t *)(uintptr_t)0x1000, buf, 0, 4), NRT_INVALID);
    EXPECT(nrt_tensor_read((nrt_tensor_t *)inputs, buf, 0, 4), NRT_INVALID); /* a set */
    EXPECT(nrt_execute((nrt_model_t *)in, inputs, outputs), NRT_INVALID);    /* a tensor */
    EXPECT(nrt_execute(model, (nrt_tensor_set_t *)foreign, outputs), NRT_INVALID);
    ASSERT(foreign[0] == 0 && foreign[1] == 0);
    /* A tensor freed while in a set is refused at the next execution, not used. */
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 512, "gone", &other));
    CHECK(nrt_add_tensor_to_tensor_set(bad_set, "input", other));
    nrt_tensor_free(&other);
    EXPECT(nrt_execute(model, bad_set, outputs), NRT_INVALID);
    looked_up = sentinel;
    EXPECT(nrt_get_tensor_from_tensor_set(bad_set, "input", &looked_up), NRT_INVALID);
    ASSERT(looked_up == sentinel);
    /* Also after the set was used (and its resolution reused) by a good execution. */
    nrt_destroy_tensor_set(&bad_set);
    CHECK(nrt_allocate_tensor_set(&bad_set));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 512, "used", &other));
    CHECK(nrt_add_tensor_to_tensor_set(bad_set, "input", other));
    CHECK(nrt_execute(model, bad_set, outputs));
    CHECK(nrt_execute(model, bad_set, outputs));
    nrt_tensor_free(&other);
    EXPECT(nrt_execute(model, bad_set, outputs), NRT_INVALID);
    EXPECT(nrt_free_model_tensor_info((nrt_tensor_info_array_t *)foreign), NRT_INVALID);
    CHECK(nrt_get_model_tensor_info(model, &info));
    CHECK(nrt_free_model_tensor_info(info));
    EXPECT(nrt_free_model_tensor_info(info), NRT_INVALID);
    CHECK(nrt_free_model_tensor_info(NULL)); /* as free(NULL) */
    /* The other tensors kept their data. */
    memset(buf, 0, sizeof buf);
    CHECK(nrt_tensor_read(in, buf, 0, sizeof buf));
    ASSERT(buf[0] == 0x5A && buf[511] == 0x5A);

    stale_model = model;
    CHECK(nrt_unload(model));
    EXPECT(nrt_unload(stale_model), NRT_INVALID);
    EXPECT(nrt_execute(stale_model, inputs, outputs), NRT_INVALID);

    /* After nrt_close: 14. */
    CHECK(nrt_load(model_bytes, model_size, 0, -1, &model));
    nrt_close();
    EXPECT(nrt_load(model_bytes, model_size, 0, -1, &model), NRT_CLOSED);
    EXPECT(nrt_execute(model, inputs, outputs), NRT_CLOSED);
    EXPECT(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, 8, "t", &other), NRT_CLOSED);
    EXPECT(nrt_tensor_read(in, buf, 0, 4), NRT_CLOSED);
    EXPECT(nrt_allocate_tensor_set(&inputs), NRT_CLOSED);
    EXPECT(nrt_unload(model), NRT_CLOSED);
    EXPECT(nrt_get_vnc_memory_stats(0, &stats, sizeof stats, &stats_size), NRT_CLOSED);
    /* Freeing still works after close. */
    nrt_tensor_free(&in);
    nrt_tensor_free(&out);
    nrt_tensor_free(&small);
    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    nrt_destroy_tensor_set(&bad_set);
    ASSERT(in == NULL && out == NULL && inputs == NULL && bad_set == NULL);
    /* A new runtime may follow (reinit.c tries it); the closed one's model stays refused. */
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    EXPECT(nrt_unload(model), NRT_INVALID);
    nrt_close();
    free(model_bytes);
    printf("GATES OK\n");
    return 0;
}
