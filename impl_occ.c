#include "h.h"
int main(int argc, char **argv) {
    (void)argc;
    CHECK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    nrt_model_t *m = load(argv[1]);
    char in[256], out[256]; size_t sz;
    io_names(m, in, out, &sz);
    nrt_tensor_t *ti, *to, *ho;
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, sz, "in", &ti));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, sz, "out", &to));
    CHECK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, -1, sz, "hout", &ho));
    nrt_tensor_set_t *is, *os, *hos;
    CHECK(nrt_allocate_tensor_set(&is)); CHECK(nrt_allocate_tensor_set(&os)); CHECK(nrt_allocate_tensor_set(&hos));
    CHECK(nrt_add_tensor_to_tensor_set(is, in, ti));
    CHECK(nrt_add_tensor_to_tensor_set(os, out, to));
    CHECK(nrt_add_tensor_to_tensor_set(hos, out, ho));
    CHECK(nrt_execute(m, is, os));
    EXPECT(nrt_execute(m, is, hos), NRT_INVALID);
    CHECK(nrt_tensor_check_output_completion(to, 3000000, 1));
    /* streaming: wait with a positive timeout shorter than the execution */
    fprintf(stderr, "poll right after execute: %s\n", nrt_get_status_as_str(nrt_tensor_check_output_completion(to, 0, 2)));
    CHECK(nrt_execute(m, is, os));
    fprintf(stderr, "poll right after 2nd execute: %s\n", nrt_get_status_as_str(nrt_tensor_check_output_completion(to, 0, 2)));
    CHECK(nrt_tensor_check_output_completion(to, 3000000, 2));
    nrt_close();
    DONE();
}
