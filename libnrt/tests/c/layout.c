/*
 * Prints sizeof and offsetof of every struct of the headers, and the ABI values of the enums,
 * one "name value" per line, for the integration test to check against the reference.
 */
#include <stddef.h>
#include <stdio.h>

#include "nrt/ndebug_stream.h"
#include "nrt/nrt.h"
#include "nrt/nrt_async.h"
#include "nrt/nrt_experimental.h"
#include "nrt/nrt_version.h"

#define SIZE(t) printf("sizeof(%s) %zu\n", #t, sizeof(t))
#define OFF(t, f) printf("offsetof(%s,%s) %zu\n", #t, #f, offsetof(t, f))
#define VALUE(v) printf("%s %ld\n", #v, (long)(v))

int main(void) {
    SIZE(nrt_version_t);
    OFF(nrt_version_t, rt_major);
    OFF(nrt_version_t, rt_minor);
    OFF(nrt_version_t, rt_patch);
    OFF(nrt_version_t, rt_maintenance);
    OFF(nrt_version_t, rt_detail);
    OFF(nrt_version_t, git_hash);
    SIZE(nrt_instance_info_t);
    OFF(nrt_instance_info_t, family);
    OFF(nrt_instance_info_t, size);
    OFF(nrt_instance_info_t, arch_name);
    OFF(nrt_instance_info_t, device_revision);
    SIZE(nrt_tensor_info_t);
    OFF(nrt_tensor_info_t, name);
    OFF(nrt_tensor_info_t, usage);
    OFF(nrt_tensor_info_t, size);
    OFF(nrt_tensor_info_t, dtype);
    OFF(nrt_tensor_info_t, shape);
    OFF(nrt_tensor_info_t, ndim);
    SIZE(nrt_tensor_info_array_t);
    OFF(nrt_tensor_info_array_t, tensor_count);
    OFF(nrt_tensor_info_array_t, tensor_array);
    SIZE(nrt_tensor_device_allocation_info_t);
    OFF(nrt_tensor_device_allocation_info_t, physical_address);
    OFF(nrt_tensor_device_allocation_info_t, size);
    OFF(nrt_tensor_device_allocation_info_t, hbm_index);
    SIZE(nrt_vnc_memory_stats_t);
    OFF(nrt_vnc_memory_stats_t, bytes_used);
    OFF(nrt_vnc_memory_stats_t, bytes_limit);
    SIZE(nrt_model_info_t);
    OFF(nrt_model_info_t, vnc);
    SIZE(nrt_tensor_batch_op_t);
    OFF(nrt_tensor_batch_op_t, offset);
    OFF(nrt_tensor_batch_op_t, size);
    OFF(nrt_tensor_batch_op_t, buffer);
    SIZE(nrt_tensor_batch_t);
    OFF(nrt_tensor_batch_t, tensor);
    OFF(nrt_tensor_batch_t, ops);
    OFF(nrt_tensor_batch_t, num_ops);
    SIZE(nrt_cc_comm_t);
    OFF(nrt_cc_comm_t, replica_group);
    OFF(nrt_cc_comm_t, rank);
    OFF(nrt_cc_comm_t, rank_n);
    OFF(nrt_cc_comm_t, ctx_device_id);
    OFF(nrt_cc_comm_t, ctx_device_count);
    OFF(nrt_cc_comm_t, vnc);
    SIZE(nrt_tensor_list_t);
    OFF(nrt_tensor_list_t, tensors);
    OFF(nrt_tensor_list_t, num_tensors);
    SIZE(NRT_STATUS);
    SIZE(nrt_dtype_t);
    SIZE(nrta_seq_t);
    VALUE(NRT_DTYPE_UINT64);
    VALUE(NRT_DTYPE_INT8);
    VALUE(NRT_DTYPE_UINT8);
    VALUE(NRT_DTYPE_INT16);
    VALUE(NRT_DTYPE_UINT16);
    VALUE(NRT_DTYPE_BFLOAT16);
    VALUE(NRT_DTYPE_FLOAT16);
    VALUE(NRT_DTYPE_INT32);
    VALUE(NRT_DTYPE_UINT32);
    VALUE(NRT_DTYPE_FLOAT32);
    VALUE(NRT_DTYPE_FP32R);
    VALUE(NRT_DTYPE_INT64);
    VALUE(NRT_DTYPE_FP8_E3);
    VALUE(NRT_DTYPE_FP8_E4);
    VALUE(NRT_DTYPE_FP8_E5);
    VALUE(NRT_OP_ADD);
    VALUE(NRT_OP_FMA);
    VALUE(NRT_OP_MAX);
    VALUE(NRT_OP_MIN);
    VALUE(NRT_OP_INVALID);
    VALUE(NRT_CC_ALLGATHER);
    VALUE(NRT_CC_ALLREDUCE);
    VALUE(NRT_CC_REDUCESCATTER);
    VALUE(NRTA_XU_TENSOR_OP);
    VALUE(NRTA_XU_COMPUTE);
    VALUE(NRTA_XU_COLLECTIVES);
    VALUE(NRTA_XU_TYPE_NUM);
    VALUE(NRT_TENSOR_PLACEMENT_DEVICE);
    VALUE(NRT_TENSOR_PLACEMENT_HOST);
    VALUE(NRT_TENSOR_USAGE_INPUT);
    VALUE(NRT_TENSOR_USAGE_OUTPUT);
    VALUE(NRT_FRAMEWORK_TYPE_NO_FW);
    VALUE(NRT_INSTANCE_TRN1);
    VALUE(NRT_INSTANCE_INF2);
    VALUE(NRT_INSTANCE_TRN2);
    VALUE(NRT_INSTANCE_TRN3E);
    VALUE(NRT_INSTANCE_SIZE_UNKNOWN);
    VALUE(NRT_TENSOR_NAME_MAX);
    VALUE(NRT_UNINITIALIZED);
    VALUE(NRT_CLOSED);
    VALUE(NRT_QUEUE_FULL);
    VALUE(NRT_EXEC_UNIT_UNRECOVERABLE);
    VALUE(NRT_EXEC_OOB);
    VALUE(NRT_NETWORK_PROXY_FAILURE);
    VALUE(NRTA_SEQ_GET_SEQ_NUM(0x0001000000000005ULL));
    VALUE(NRTA_SEQ_GET_XU_ID(0x0001000000000005ULL));
    SIZE(ndebug_stream_event_header_t);
    OFF(ndebug_stream_event_header_t, data_size);
    OFF(ndebug_stream_event_header_t, type);
    OFF(ndebug_stream_event_header_t, reserved);
    SIZE(ndebug_stream_payload_debug_tensor_read_t);
    OFF(ndebug_stream_payload_debug_tensor_read_t, prefix);
    OFF(ndebug_stream_payload_debug_tensor_read_t, logical_nc_id);
    OFF(ndebug_stream_payload_debug_tensor_read_t, pipe);
    OFF(ndebug_stream_payload_debug_tensor_read_t, tensor_dtype);
    OFF(ndebug_stream_payload_debug_tensor_read_t, tensor_shape);
    OFF(ndebug_stream_payload_debug_tensor_read_t, tensor_data_size);
    OFF(ndebug_stream_payload_debug_tensor_read_t, reserved0);
    OFF(ndebug_stream_payload_debug_tensor_read_t, tensor_data);
    VALUE(NDEBUG_STREAM_EVENT_TYPE_INVALID);
    VALUE(NDEBUG_STREAM_EVENT_TYPE_DEBUG_TENSOR_READ);
    return 0;
}
