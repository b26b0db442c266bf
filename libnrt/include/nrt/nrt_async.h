/*
 * nrt/nrt_async.h - the explicit asynchronous API (3.x): requests scheduled on execution units
 * (XUs) of a logical core, each XU running its requests one at a time in submit order.
 *
 * Written for this project from the public facts of libnrt's API. Schedule calls never block:
 * a full queue is NRT_QUEUE_FULL and nothing changes (no sequence number is used).
 *
 * The caller's contract for `ret` (NRT_STATUS *), as libnrt's: it must be non-NULL and stay
 * valid and writable from the schedule call until the request is reported complete, and the
 * caller must not write it meanwhile. The library writes the request's status there once, from
 * one of its own threads, before the request is reported complete by nrta_is_completed,
 * nrta_get_sequence or a registered eventfd (so after any of those, `ret` holds the status).
 * A request's tensors must stay allocated until it completes (nrt_tensor_free refuses a tensor
 * a scheduled request uses, naming the request). nrta_tensor_read's `buf` is written before the
 * request completes and must stay valid, untouched, until then. Eventfds passed to the
 * registration calls stay the caller's: the library signals a duplicate and never closes the
 * caller's descriptor.
 */
#ifndef NRT_NRT_ASYNC_H
#define NRT_NRT_ASYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "nrt/nrt_status.h"
#include "nrt/nrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Execution unit types of a logical core. */
typedef enum {
    NRTA_XU_TENSOR_OP = 0,   /**< Tensor reads, writes and copies (2 queues). */
    NRTA_XU_COMPUTE = 1,     /**< Model executions (1 queue). */
    NRTA_XU_COLLECTIVES = 2, /**< Collective operations (3 queues). */
    NRTA_XU_TYPE_NUM = 3     /**< Number of types (sizes per-XU arrays). */
} nrta_xu_t;

/** A request's sequence id: XU id in the high 16 bits, sequence number in the low 48. */
typedef uint64_t nrta_seq_t;

/** The sequence number part of a sequence id. */
#define NRTA_SEQ_GET_SEQ_NUM(seq) ((uint64_t)(seq) & 0xFFFFFFFFFFFFULL)
/** The XU id part of a sequence id. */
#define NRTA_SEQ_GET_XU_ID(seq) ((uint64_t)(seq) >> 48)

/** Schedules a copy of `size` bytes from `buf` (copied before returning) to byte `offset` of `tensor` on TENSOR_OP queue `queue` of core `lnc_idx`, whose DMA engines move it (`tensor` may be on any core). */
NRT_STATUS nrta_tensor_write(nrt_tensor_t *tensor, const void *buf, uint64_t offset, uint64_t size,
                             int lnc_idx, int queue, NRT_STATUS *ret, nrta_seq_t *req_sequence);

/** Schedules a copy of `size` bytes from byte `offset` of `tensor` to `buf` on TENSOR_OP queue `queue` of core `lnc_idx`, whose DMA engines move it (`tensor` may be on any core). */
NRT_STATUS nrta_tensor_read(void *buf, nrt_tensor_t *tensor, uint64_t offset, uint64_t size,
                            int lnc_idx, int queue, NRT_STATUS *ret, nrta_seq_t *req_sequence);

/** Schedules a device-to-device copy between tensors of one logical core on TENSOR_OP queue `queue`. */
NRT_STATUS nrta_tensor_copy(nrt_tensor_t *src, uint64_t src_offset, nrt_tensor_t *dst,
                            uint64_t dst_offset, uint64_t size, int queue, NRT_STATUS *ret,
                            nrta_seq_t *req_sequence);

/** Schedules one execution of `model` on its core's COMPUTE XU (`queue` must be 0); device tensors only. */
NRT_STATUS nrta_execute_schedule(nrt_model_t *model, const nrt_tensor_set_t *input,
                                 nrt_tensor_set_t *output, int queue, NRT_STATUS *ret,
                                 nrta_seq_t *req_sequence);

/** Prepares a collective operation over `comm`'s replica group. simdev is one device with no
 * collective engines: this library refuses it (NRT_INVALID, naming why) and writes nothing to
 * `cc_ctx`, so a program that uses collectives builds and fails cleanly at run time. */
NRT_STATUS nrta_cc_prepare(nrt_cc_comm_t *comm, nrt_tensor_list_t *input,
                           nrt_tensor_list_t *output, nrt_dtype_t dtype, nrt_op_type_t op,
                           nrt_cc_op_type_t cc_op, nrt_cc_context_t **cc_ctx);

/** Schedules a prepared collective on the COLLECTIVES XU (`queue` must be 0). No context is
 * ever prepared here (nrta_cc_prepare): NRT_INVALID. */
NRT_STATUS nrta_cc_schedule(nrt_cc_context_t **cc_ctx, int queue, NRT_STATUS *ret,
                            nrta_seq_t *req_sequence);

/**
 * Whether request `seq` has completed; NRT_INVALID for a sequence id of no XU or one not yet
 * handed out. Sequence number 0 is never handed out: it is what nrta_get_sequence reports
 * before anything completed, so (xu_id << 48 | 0), and a zeroed nrta_seq_t, read as
 * completed. Check a schedule's status before its req_sequence.
 */
NRT_STATUS nrta_is_completed(nrta_seq_t seq, bool *is_completed);

/** The last completed sequence id of queue `queue` of XU `xu` on core `lnc` (sequence number
 * 0 before any completed). */
NRT_STATUS nrta_get_sequence(uint32_t lnc, nrta_xu_t xu, int queue, nrta_seq_t *seq);

/** Signals eventfd `fd` (writes 1) when request `seq` completes (at once if it has); `fd` -1 deregisters every eventfd of `seq`. */
NRT_STATUS nrta_event_register_seq_id_completion(nrta_seq_t seq, int fd);

/** Signals eventfd `fd` (adds 1) after every completion on queue `queue` of XU `xu` on core `lnc` from now on, replacing an earlier eventfd; `fd` -1 deregisters. */
NRT_STATUS nrta_event_register_xu_completion(int lnc, nrta_xu_t xu, int queue, int fd);

#ifdef __cplusplus
}
#endif

#endif /* NRT_NRT_ASYNC_H */
