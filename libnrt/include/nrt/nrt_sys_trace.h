/*
 * nrt/nrt_sys_trace.h - the system trace: a bounded ring of runtime events per NeuronCore
 * (execution spans and tensor operations, with sequence ids, core and timestamps), captured
 * between nrt_sys_trace_start and nrt_sys_trace_stop and fetched as JSON.
 *
 * Written for this project from the public facts of libnrt's API.
 *
 * Fetched document: one JSON object whose "events" member is an array of event objects in
 * capture order; each event names its type, its logical core, its sequence id when it has one,
 * and its start and end timestamps in nanoseconds. Fetching consumes the events returned.
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

/** Starts capturing with `config`. */
NRT_STATUS nrt_sys_trace_start(nrt_sys_trace_config_t *config);

/** Stops capturing; captured events stay fetchable. */
NRT_STATUS nrt_sys_trace_stop(void);

/** New fetch options (default: every core). */
NRT_STATUS nrt_sys_trace_fetch_options_allocate(nrt_sys_trace_fetch_options_t **options);

/** Frees fetch options. */
void nrt_sys_trace_fetch_options_free(nrt_sys_trace_fetch_options_t *options);

/** Fetches only logical core `nc_idx`'s events. */
void nrt_sys_trace_fetch_options_set_nc_idx(nrt_sys_trace_fetch_options_t *options, uint64_t nc_idx);

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
