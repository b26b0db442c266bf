/*
 * A dlopen user, as libfabric is: opens "libnrt.so.1" by name (found through the loader's
 * search path), resolves every function named on the command line with dlsym, then runs the
 * developer-guide flow through the resolved pointers. Usage: dlopen MODEL NAME...
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "nrt/nrt.h"
#include "nrt/nrt_async.h"
#include "nrt/nrt_experimental.h"
#include "nrt/nrt_profile.h"
#include "nrt/nrt_sys_trace.h"
#include "common.h"
#include "proc_threads.h"

/* A function pointer of the exact type the header declares, resolved by name (copied from the
 * object pointer dlsym returns, the POSIX way: ISO C has no cast between the two). */
#define RESOLVE(lib, name)                          \
    __typeof__(&name) p_##name;                     \
    do {                                            \
        void *sym_ = resolve(lib, #name);           \
        memcpy(&p_##name, &sym_, sizeof p_##name);  \
    } while (0)

static void *resolve(void *lib, const char *name) {
    void *sym = dlsym(lib, name);
    if (!sym) {
        fprintf(stderr, "dlsym(%s): %s\n", name, dlerror());
        exit(1);
    }
    return sym;
}

int main(int argc, char **argv) {
    void *lib;
    int i;
    size_t size = 0, j;
    void *bytes;
    nrt_model_t *model = NULL;
    nrt_tensor_t *in = NULL, *out = NULL;
    nrt_tensor_set_t *inputs = NULL, *outputs = NULL;
    nrt_tensor_info_array_t *info = NULL;
    unsigned char want[512], got[512];
    uint32_t count = 0;

    ASSERT(argc >= 3);
    lib = dlopen("libnrt.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen(libnrt.so.1): %s\n", dlerror());
        return 1;
    }
    for (i = 2; i < argc; i++) {
        (void)resolve(lib, argv[i]);
    }
    {
        RESOLVE(lib, nrt_get_status_as_str);
        RESOLVE(lib, nrt_get_total_nc_count);
        RESOLVE(lib, nrt_init);
        RESOLVE(lib, nrt_load);
        RESOLVE(lib, nrt_get_model_tensor_info);
        RESOLVE(lib, nrt_free_model_tensor_info);
        RESOLVE(lib, nrt_tensor_allocate);
        RESOLVE(lib, nrt_tensor_get_va);
        RESOLVE(lib, nrt_memcpy_to_device);
        RESOLVE(lib, nrt_tensor_read);
        RESOLVE(lib, nrt_allocate_tensor_set);
        RESOLVE(lib, nrt_add_tensor_to_tensor_set);
        RESOLVE(lib, nrt_execute);
        RESOLVE(lib, nrt_destroy_tensor_set);
        RESOLVE(lib, nrt_tensor_free);
        RESOLVE(lib, nrt_unload);
        RESOLVE(lib, nrt_close);
        RESOLVE(lib, nrta_execute_schedule);
        RESOLVE(lib, nrta_tensor_write);
        RESOLVE(lib, nrta_tensor_read);
        RESOLVE(lib, nrta_tensor_copy);
        RESOLVE(lib, nrta_is_completed);
        RESOLVE(lib, nrta_get_sequence);
        RESOLVE(lib, nrta_event_register_seq_id_completion);
        RESOLVE(lib, nrta_event_register_xu_completion);
        RESOLVE(lib, nrt_profile_start);
        RESOLVE(lib, nrt_profile_stop);
        RESOLVE(lib, nrt_sys_trace_config_allocate);
        RESOLVE(lib, nrt_sys_trace_config_free);
        RESOLVE(lib, nrt_sys_trace_start);
        RESOLVE(lib, nrt_sys_trace_stop);
        RESOLVE(lib, nrt_sys_trace_fetch_events);
        RESOLVE(lib, nrt_sys_trace_buffer_free);
        NRT_STATUS ret = (NRT_STATUS)0xDEAD;
        nrta_seq_t seq = 0, last = 0;
        bool done = false;
        nrt_sys_trace_config_t *trace = NULL;
        char *json = NULL;
        size_t json_len = 0;

        /* What libfabric does first: count the cores before nrt_init. */
        ASSERT(p_nrt_get_total_nc_count(&count) == NRT_SUCCESS && count >= 1);
        ASSERT(p_nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", "") == NRT_SUCCESS);
        bytes = read_file(argv[1], &size);
        ASSERT(p_nrt_load(bytes, size, 0, -1, &model) == NRT_SUCCESS);
        free(bytes);
        ASSERT(p_nrt_get_model_tensor_info(model, &info) == NRT_SUCCESS);
        ASSERT(info->tensor_count == 2);
        ASSERT(p_nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 512, "in", &in) == NRT_SUCCESS);
        ASSERT(p_nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 512, "out", &out) == NRT_SUCCESS);
        for (j = 0; j < sizeof want; j++) {
            want[j] = (unsigned char)(255 - j);
        }
        /* libfabric's path: write through the device mapping. */
        ASSERT(p_nrt_tensor_get_va(in) != NULL);
        ASSERT(p_nrt_memcpy_to_device(p_nrt_tensor_get_va(in), want, sizeof want) == NRT_SUCCESS);
        ASSERT(p_nrt_allocate_tensor_set(&inputs) == NRT_SUCCESS);
        ASSERT(p_nrt_allocate_tensor_set(&outputs) == NRT_SUCCESS);
        ASSERT(p_nrt_add_tensor_to_tensor_set(inputs, "input", in) == NRT_SUCCESS);
        ASSERT(p_nrt_add_tensor_to_tensor_set(outputs, "output", out) == NRT_SUCCESS);
        ASSERT(p_nrt_execute(model, inputs, outputs) == NRT_SUCCESS);
        ASSERT(p_nrt_tensor_read(out, got, 0, sizeof got) == NRT_SUCCESS);
        ASSERT(memcmp(want, got, sizeof got) == 0);
        /* The explicit async API and the system trace, through resolved pointers. */
        ASSERT(p_nrt_sys_trace_config_allocate(&trace) == NRT_SUCCESS);
        ASSERT(p_nrt_sys_trace_start(trace) == NRT_SUCCESS);
        memset(got, 0, sizeof got);
        ASSERT(p_nrta_execute_schedule(model, inputs, outputs, 0, &ret, &seq) == NRT_SUCCESS);
        do {
            ASSERT(p_nrta_is_completed(seq, &done) == NRT_SUCCESS);
        } while (!done);
        ASSERT(ret == NRT_SUCCESS);
        ASSERT(p_nrta_get_sequence(0, NRTA_XU_COMPUTE, 0, &last) == NRT_SUCCESS && last == seq);
        ret = (NRT_STATUS)0xDEAD;
        ASSERT(p_nrta_tensor_read(got, out, 0, sizeof got, 0, 1, &ret, &seq) == NRT_SUCCESS);
        do {
            ASSERT(p_nrta_is_completed(seq, &done) == NRT_SUCCESS);
        } while (!done);
        ASSERT(ret == NRT_SUCCESS && memcmp(want, got, sizeof got) == 0);
        ASSERT(p_nrt_sys_trace_stop() == NRT_SUCCESS);
        ASSERT(p_nrt_sys_trace_fetch_events(&json, &json_len, NULL) == NRT_SUCCESS);
        ASSERT(strstr(json, "\"execute\"") != NULL && strlen(json) == json_len);
        p_nrt_sys_trace_buffer_free(json);
        p_nrt_sys_trace_config_free(trace);
        p_nrt_destroy_tensor_set(&inputs);
        p_nrt_destroy_tensor_set(&outputs);
        p_nrt_tensor_free(&in);
        p_nrt_tensor_free(&out);
        ASSERT(p_nrt_free_model_tensor_info(info) == NRT_SUCCESS);
        ASSERT(p_nrt_unload(model) == NRT_SUCCESS);
        p_nrt_close();
        /* No thread of the library outlives nrt_close (the async API's completion relay
         * included), so unloading it below unmaps no code a thread still runs. */
        if (!alone()) {
            fprintf(stderr, "threads are left after nrt_close\n");
            return 1;
        }
        ASSERT(strcmp(p_nrt_get_status_as_str(NRT_SUCCESS), "NRT_SUCCESS") == 0);
    }
    dlclose(lib);
    printf("DLOPEN OK %d symbols\n", argc - 2);
    return 0;
}
