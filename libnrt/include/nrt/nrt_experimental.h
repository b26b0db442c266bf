/*
 * nrt/nrt_experimental.h - model tensor information, mapped-memory copies and the implicit
 * asynchronous execution mode.
 *
 * Written for this project from the public facts of libnrt's API.
 */
#ifndef NRT_NRT_EXPERIMENTAL_H
#define NRT_NRT_EXPERIMENTAL_H

#include <stddef.h>
#include <stdint.h>
#include "nrt/nrt_status.h"
#include "nrt/nrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/** How a model uses a tensor. */
typedef enum nrt_tensor_usage {
    NRT_TENSOR_USAGE_INPUT = 0,  /**< An input. */
    NRT_TENSOR_USAGE_OUTPUT = 1  /**< An output. */
} nrt_tensor_usage_t;

/** Size of nrt_tensor_info_t::name, and the longest tensor name (with its NUL) the API takes. */
#define NRT_TENSOR_NAME_MAX 256

/** One input or output of a model (296 bytes). */
typedef struct nrt_tensor_info {
    char name[NRT_TENSOR_NAME_MAX]; /**< The I/O name tensor sets bind it by, NUL-terminated. */
    nrt_tensor_usage_t usage;       /**< Input or output. */
    size_t size;                    /**< Size in bytes. */
    nrt_dtype_t dtype;              /**< Element type. */
    uint32_t *shape;                /**< `ndim` dimensions, outermost first (owned by the array). */
    uint32_t ndim;                  /**< Number of dimensions. */
} nrt_tensor_info_t;

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#endif
/** Every input and output of a model, allocated by nrt_get_model_tensor_info. */
typedef struct nrt_tensor_info_array {
    uint64_t tensor_count;              /**< Entries in tensor_array. */
    nrt_tensor_info_t tensor_array[];   /**< Inputs, then outputs. */
} nrt_tensor_info_array_t;
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif

/**
 * Every input and output of `model`: a library-allocated array in `*tensor_info`, freed with
 * nrt_free_model_tensor_info (once).
 */
NRT_STATUS nrt_get_model_tensor_info(nrt_model_t *model, nrt_tensor_info_array_t **tensor_info);

/**
 * Frees an array from nrt_get_model_tensor_info; NULL does nothing (NRT_SUCCESS), and a pointer
 * it did not return is refused.
 */
NRT_STATUS nrt_free_model_tensor_info(nrt_tensor_info_array_t *tensor_info);

/**
 * Copies `size` bytes from `src` to `dest`, an address inside a device tensor's mapping
 * (nrt_tensor_get_va); an address no tensor of this library covers is refused.
 */
NRT_STATUS nrt_memcpy_to_device(void *dest, const void *src, size_t size);

/** The Neuron device (its index, as in neuron-ls) holding visible logical core `lnc_idx`. */
NRT_STATUS nrt_get_device_id(int lnc_idx, int *device_id);

/**
 * libnrt's hook for the NCCL network plugin (internal, temporary in libnrt too): NULL here,
 * with `*err` non-zero and the reason in `err_msg` (at most `err_msg_size` bytes, terminated)
 * — simdev has no network for collectives across hosts.
 */
void *nrt_get_libnccl_net(int *err, char *err_msg, size_t err_msg_size);

/** Completion callback of the implicit asynchronous mode. */
typedef void (*nrt_async_exec_callback_t)(void *params, uint32_t model_id, uint32_t vnc,
                                          uint64_t job_id, NRT_STATUS status);

/**
 * Registers the callback run on the runtime's thread after each execution in the implicit
 * asynchronous mode (NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS > 0); replaces an earlier one.
 * NRT_INVALID when the mode is off.
 */
NRT_STATUS nrt_register_async_exec_callback(nrt_async_exec_callback_t callback, void *params);

/** Blocks until logical core `vnc` has no queued implicit asynchronous execution. */
NRT_STATUS nrt_async_drain_queued_execs(int32_t vnc);

/**
 * A barrier of the `g_device_count` ranks (a small all-reduce on silicon). For a group of one
 * (rank 0) every rank has arrived: NRT_SUCCESS at once; a larger group is NRT_INVALID
 * (collectives across ranks are not simulated yet).
 */
NRT_STATUS nrt_barrier(int32_t vnc, uint32_t g_device_id, uint32_t g_device_count);

/**
 * Gathers `rank_input_size` bytes of `input` from every rank into `output`
 * (`g_device_count * rank_input_size` bytes, rank order). For a group of one (rank 0),
 * `input` is copied to `output`; a larger group is NRT_INVALID, before either buffer is
 * touched.
 */
NRT_STATUS nrt_all_gather(int32_t vnc, uint32_t g_device_id, uint32_t g_device_count,
                          uint32_t rank_input_size, void *input, void *output);

#ifdef __cplusplus
}
#endif

#endif /* NRT_NRT_EXPERIMENTAL_H */
