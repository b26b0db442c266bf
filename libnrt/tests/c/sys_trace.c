/*
 * The system trace and the profile from C: a capture configuration (registry handles: a freed
 * or foreign pointer refused), start, N executions and M tensor writes, stop, fetch as JSON
 * (printed between JSON<< and >>JSON for the driving test to parse), a second fetch (the
 * events were consumed), and nrt_profile_start/stop writing a Chrome-trace JSON file.
 * Usage: sys_trace MODEL PROFILE_PATH
 */
#include <stdint.h>
#include <string.h>

#include "nrt/nrt.h"
#include "nrt/nrt_async.h"
#include "nrt/nrt_profile.h"
#include "nrt/nrt_sys_trace.h"
#include "common.h"

#define EXECUTES 10
#define WRITES 3
#define PROFILED 5

static void fetch_and_print(const nrt_sys_trace_fetch_options_t *options) {
    char *json = NULL;
    size_t len = 0;
    CHECK(nrt_sys_trace_fetch_events(&json, &len, options));
    ASSERT(json != NULL && strlen(json) == len && json[0] == '{');
    printf("JSON<<%s>>JSON\n", json);
    nrt_sys_trace_buffer_free(json);
}

int main(int argc, char **argv) {
    size_t size = 0, count = 0;
    void *bytes;
    nrt_model_t *model = NULL;
    nrt_tensor_t *in = NULL, *out = NULL;
    nrt_tensor_set_t *inputs = NULL, *outputs = NULL;
    nrt_sys_trace_config_t *config = NULL, *freed = NULL;
    nrt_sys_trace_fetch_options_t *options = NULL;
    const char **types = NULL;
    char *json = NULL;
    unsigned char buf[512];
    NRT_STATUS rets[WRITES];
    nrta_seq_t seq;
    bool done;
    int i;
    uint64_t local = 0;

    ASSERT(argc == 3);
    /* Configurations are plain data: usable before nrt_init. */
    CHECK(nrt_sys_trace_config_allocate(&config));
    EXPECT(nrt_sys_trace_start(config), NRT_UNINITIALIZED);
    CHECK(nrt_sys_trace_get_event_types(&types, &count));
    ASSERT(count == 2 && strcmp(types[0], "execute") == 0 && strcmp(types[1], "tensor_op") == 0);
    nrt_sys_trace_free_event_types(types, count);
    nrt_sys_trace_config_set_defaults(config);
    nrt_sys_trace_config_set_max_events_per_nc(config, 1024);
    nrt_sys_trace_config_set_capture_enabled_for_nc(config, 0, true);
    EXPECT(nrt_sys_trace_config_set_capture_enabled_for_event_type(config, "bogus", true), NRT_INVALID);
    CHECK(nrt_sys_trace_config_set_capture_enabled_for_event_type(config, "tensor_op", false));
    CHECK(nrt_sys_trace_config_get_enabled_event_types(config, &types, &count));
    ASSERT(count == 1 && strcmp(types[0], "execute") == 0);
    nrt_sys_trace_free_event_types(types, count);
    CHECK(nrt_sys_trace_config_set_capture_enabled_for_event_type(config, "tensor_op", true));
    CHECK(nrt_sys_trace_config_allocate(&freed));
    nrt_sys_trace_config_free(freed);
    CHECK(nrt_sys_trace_fetch_options_allocate(&options));
    nrt_sys_trace_fetch_options_set_defaults(options);
    nrt_sys_trace_fetch_options_set_nc_idx(options, 0);

    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    bytes = read_file(argv[1], &size);
    CHECK(nrt_load(bytes, size, 0, -1, &model));
    free(bytes);
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 512, "in", &in));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 512, "out", &out));
    CHECK(nrt_allocate_tensor_set(&inputs));
    CHECK(nrt_allocate_tensor_set(&outputs));
    CHECK(nrt_add_tensor_to_tensor_set(inputs, "input", in));
    CHECK(nrt_add_tensor_to_tensor_set(outputs, "output", out));
    memset(buf, 0x5A, sizeof buf);

    /* A freed or foreign configuration is refused. */
    EXPECT(nrt_sys_trace_start(freed), NRT_INVALID);
    EXPECT(nrt_sys_trace_start((nrt_sys_trace_config_t *)&local), NRT_INVALID);
    EXPECT(nrt_sys_trace_fetch_events(&json, &size, (const nrt_sys_trace_fetch_options_t *)&local),
           NRT_INVALID);
    EXPECT(nrt_sys_trace_fetch_events(NULL, &size, options), NRT_INVALID);
    ASSERT(local == 0 && json == NULL);

    CHECK(nrt_sys_trace_start(config));
    EXPECT(nrt_sys_trace_start(config), NRT_INVALID); /* already capturing */
    for (i = 0; i < EXECUTES; i++) {
        CHECK(nrt_execute(model, inputs, outputs));
    }
    for (i = 0; i < WRITES; i++) {
        rets[i] = (NRT_STATUS)0xDEAD;
        CHECK(nrta_tensor_write(in, buf, 0, sizeof buf, 0, 0, &rets[i], &seq));
    }
    do {
        CHECK(nrta_is_completed(seq, &done));
    } while (!done);
    for (i = 0; i < WRITES; i++) {
        ASSERT(rets[i] == NRT_SUCCESS);
    }
    CHECK(nrt_sys_trace_stop());
    fetch_and_print(options);
    fetch_and_print(NULL); /* consumed: no event left */
    nrt_sys_trace_buffer_free((char *)&local); /* a stranger's pointer: refused, logged */

    /* The profile: a Chrome-trace JSON file of the model's executions. */
    EXPECT(nrt_profile_start(NULL, argv[2]), NRT_INVALID);
    EXPECT(nrt_profile_start(model, NULL), NRT_INVALID);
    CHECK(nrt_profile_start(model, argv[2]));
    for (i = 0; i < PROFILED; i++) {
        CHECK(nrt_execute(model, inputs, outputs));
    }
    EXPECT(nrt_profile_stop("/nonexistent/never-started.json"), NRT_INVALID);
    CHECK(nrt_profile_stop(argv[2]));

    nrt_sys_trace_fetch_options_free(options);
    nrt_sys_trace_config_free(config);
    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    nrt_tensor_free(&in);
    nrt_tensor_free(&out);
    CHECK(nrt_unload(model));
    nrt_close();
    printf("SYS TRACE OK\n");
    return 0;
}
