/*
 * nrt/ndebug_stream.h - the debug stream: tensors a model's device prints send to a host client,
 * one client per logical core.
 *
 * Written for this project from the public facts of libnrt's API; the types have libnrt's names
 * and layouts. This runtime has no debug-stream events to deliver (on simdev a NEFF's
 * instructions are not decoded and the simulator ISA has no device print; on a Neuron device the
 * runtime does not read the device's stream): nrt_debug_client_connect answers NRT_INVALID,
 * saying so, after checking its arguments. The header lets a program with a debug handler build
 * unchanged.
 */
#ifndef NRT_NDEBUG_STREAM_H
#define NRT_NDEBUG_STREAM_H

#include <stdint.h>
#include "nrt/nrt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The kind of an event. */
typedef enum ndebug_stream_event_type {
    NDEBUG_STREAM_EVENT_TYPE_INVALID = 0,
    /** A device print's tensor: the payload is an ndebug_stream_payload_debug_tensor_read_t. */
    NDEBUG_STREAM_EVENT_TYPE_DEBUG_TENSOR_READ = 1,
} ndebug_stream_event_type_t;

/** One event's header (64 bytes). */
typedef struct ndebug_stream_event_header {
    uint64_t data_size; /* bytes of the payload */
    uint32_t type;      /* an ndebug_stream_event_type_t */
    char reserved[52];
} ndebug_stream_event_header_t;

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic" /* the flexible array member, in C++ */
#endif
/** The payload of a NDEBUG_STREAM_EVENT_TYPE_DEBUG_TENSOR_READ event: 1024 bytes, then the data. */
typedef struct ndebug_stream_payload_debug_tensor_read {
    char prefix[512];          /* the print's prefix, NUL-terminated */
    uint32_t logical_nc_id;    /* the logical core that printed */
    uint32_t pipe;             /* 0: standard output; otherwise standard error */
    char tensor_dtype[16];     /* the element type's name, NUL-terminated */
    uint64_t tensor_shape[8];  /* dimensions; unused ones 0 */
    uint64_t tensor_data_size; /* bytes of tensor_data */
    char reserved0[416];
    char tensor_data[];
} ndebug_stream_payload_debug_tensor_read_t;
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/**
 * Connects to the debug stream of logical core `logical_nc_idx`; `*stream_fd` is the
 * connection's descriptor (epoll-able). One client per core; the calling process only.
 * Here: NRT_INVALID (no events exist to deliver), after NRT_INVALID for a NULL `stream_fd` or a
 * core this process does not see. `*stream_fd` is left untouched.
 */
NRT_STATUS nrt_debug_client_connect(int32_t logical_nc_idx, int *stream_fd);

/** Closes a connection made by nrt_debug_client_connect. Here: none exists (a refusal, logged). */
void nrt_debug_client_connect_close(int stream_fd);

/**
 * Takes one event: its header, and in `*payload` a malloc'd copy of its payload (the caller
 * frees it); NRT_QUEUE_EMPTY when none is waiting. Here: NRT_INVALID (no connection exists),
 * after NRT_INVALID for a NULL `header` or `payload`; both are left untouched.
 */
NRT_STATUS nrt_debug_client_read_one_event(int stream_fd, ndebug_stream_event_header_t *header,
                                           void **payload);

#ifdef __cplusplus
}
#endif

#endif /* NRT_NDEBUG_STREAM_H */
