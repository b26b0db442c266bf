/*
 * nrt/nrt_sys_trace.h - the system trace: a bounded ring of runtime events per NeuronCore
 * (execution spans and tensor operations, with sequence ids, core and timestamps), captured
 * between nrt_sys_trace_start and nrt_sys_trace_stop and fetched as JSON.
 *
 * Written for this project from the public facts of libnrt's API.
 *
 * The fetched document (nrt_sys_trace_fetch_events), one JSON object. Timestamps are host
 * CLOCK_MONOTONIC nanoseconds since nrt_init (`epoch_unix_ns` is the wall clock then):
 *
 *   { "schema": "nrt_sys_trace/1", "clock": "host monotonic ns since nrt_init",
 *     "epoch_unix_ns": N, "capturing": true|false, "event_types": ["execute", "tensor_op"],
 *     "ncs": [ { "nc_idx": 0, "physical_ncs": [0], "capture_enabled": true,
 *                "capacity": 16384, "recorded": N, "dropped": N, "held": N,
 *                "events": [ EVENT, ... ] }, ... ] }
 *
 * `ncs` lists every logical core, or only the one the fetch options name. `recorded` counts
 * the events recorded since start, `dropped` those overwritten before they were fetched, `held`
 * those still in the ring after this fetch. Each EVENT has `event_idx` (its position among the
 * core's recorded events: a gap is a drop) and `type`:
 *  - "execute": one model execution. `model_id`, `model` (its name while loaded, else null),
 *    `seq_id` (its nrta_seq_t; under the implicit asynchronous mode the callback's job id),
 *    `seq_num`, `compute_idx`, `physical_ncs`, `submit_ns` (call bound), `start_ns` (doorbell
 *    about to ring), `end_ns` (completion harvested), `device_ts_ns` (the device's own clock
 *    when it posted the completion: not the host clock above and not comparable with it; on
 *    simdev, nanoseconds since simdev started), `device_busy_ns` (the device's time executing
 *    it), `status` (e.g. "NRT_SUCCESS") and `status_code`; submit_ns <= start_ns <= end_ns.
 *    While the model is loaded, `device_program` says what the device ran ("container",
 *    "neff_shape_only", "neff_reference" or "device") and `shape_only` is true when simdev
 *    ran a NEFF shape-only (outputs and device_busy_ns are its stand-in, not the model's: simdev
 *    does not decode NEFF instructions); both are null once the model is unloaded.
 *  - "tensor_op": one nrta_tensor_read/write/copy. `op` ("read", "write" or "copy"), `seq_id`,
 *    `seq_num`, `queue`, `bytes`, `submit_ns`, `start_ns`, `end_ns`, `status`, `status_code`.
 * Fetching removes the returned events from the rings; stopping keeps them fetchable until the
 * next nrt_sys_trace_start, which begins with empty rings.
 *
 * Configurations and fetch options are handles of this library: a pointer it did not hand out,
 * or one already freed, is refused (NRT_INVALID, or logged and ignored by the void calls).
 */
#ifndef NRT_NRT_SYS_TRACE_H
#define NRT_NRT_SYS_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "nrt/nrt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Capture configuration (opaque). */
typedef struct nrt_sys_trace_config nrt_sys_trace_config_t;
/** Fetch options (opaque). */
typedef struct nrt_sys_trace_fetch_options nrt_sys_trace_fetch_options_t;

/** A new capture configuration with the defaults (every core, every event type). */
NRT_STATUS nrt_sys_trace_config_allocate(nrt_sys_trace_config_t **config);

/** Resets `config` to the defaults. */
void nrt_sys_trace_config_set_defaults(nrt_sys_trace_config_t *config);

/** Frees a capture configuration. */
void nrt_sys_trace_config_free(nrt_sys_trace_config_t *config);

/** Bounds each core's ring to `max_events_per_nc` events (the oldest are dropped). */
void nrt_sys_trace_config_set_max_events_per_nc(nrt_sys_trace_config_t *config, uint64_t max_events_per_nc);

/** Enables or disables capture on logical core `nc_idx`. */
void nrt_sys_trace_config_set_capture_enabled_for_nc(nrt_sys_trace_config_t *config, uint32_t nc_idx, bool enabled);

/** Enables or disables capture of events of type `event_type`; NRT_INVALID for an unknown type. */
NRT_STATUS nrt_sys_trace_config_set_capture_enabled_for_event_type(nrt_sys_trace_config_t *config,
                                                                   const char *event_type, bool enabled);

/**
 * Starts capturing with `config` (NULL: the defaults) into empty rings: events of an earlier
 * capture not fetched yet are discarded. NRT_INVALID when already capturing.
 */
NRT_STATUS nrt_sys_trace_start(nrt_sys_trace_config_t *config);

/** Stops capturing; captured events stay fetchable until the next start. */
NRT_STATUS nrt_sys_trace_stop(void);

/** New fetch options (default: every core). */
NRT_STATUS nrt_sys_trace_fetch_options_allocate(nrt_sys_trace_fetch_options_t **options);

/** Frees fetch options. */
void nrt_sys_trace_fetch_options_free(nrt_sys_trace_fetch_options_t *options);

/** Fetches only logical core `nc_idx`'s events. */
void nrt_sys_trace_fetch_options_set_nc_idx(nrt_sys_trace_fetch_options_t *options, uint64_t nc_idx);

/** Resets `options` to the defaults (every core, every held event). */
void nrt_sys_trace_fetch_options_set_defaults(nrt_sys_trace_fetch_options_t *options);

/** Fetches at most `max_events_per_nc` events of each core, the oldest first. */
void nrt_sys_trace_fetch_options_set_max_events_per_nc(nrt_sys_trace_fetch_options_t *options,
                                                        uint64_t max_events_per_nc);

/** Every event type's name ("execute", "tensor_op") in a library-allocated array of `*count` static strings, freed with nrt_sys_trace_free_event_types. */
NRT_STATUS nrt_sys_trace_get_event_types(const char ***event_types, size_t *count);

/** The event types `config` captures, as nrt_sys_trace_get_event_types returns them. */
NRT_STATUS nrt_sys_trace_config_get_enabled_event_types(const nrt_sys_trace_config_t *config,
                                                        const char ***event_types, size_t *count);

/** Frees an array from nrt_sys_trace_get_event_types or _config_get_enabled_event_types (its `count`). */
void nrt_sys_trace_free_event_types(const char **event_types, size_t count);

/**
 * The captured events as a NUL-terminated JSON document in `*buffer` (`*written_size` bytes
 * without the NUL), freed with nrt_sys_trace_buffer_free. `options` may be NULL (every core).
 */
NRT_STATUS nrt_sys_trace_fetch_events(char **buffer, size_t *written_size,
                                      const nrt_sys_trace_fetch_options_t *options);

/** Frees a buffer from nrt_sys_trace_fetch_events. */
void nrt_sys_trace_buffer_free(char *buffer);

#ifdef __cplusplus
}
#endif

#endif /* NRT_NRT_SYS_TRACE_H */
