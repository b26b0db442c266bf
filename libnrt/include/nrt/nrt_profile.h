/*
 * nrt/nrt_profile.h - per-model execution profiles.
 *
 * Written for this project from the public facts of libnrt's API. The file written is a
 * Chrome trace-event JSON document (it opens in Perfetto), NOT an NTFF file: the Neuron
 * profiler's tools do not read it.
 */
#ifndef NRT_NRT_PROFILE_H
#define NRT_NRT_PROFILE_H

#include "nrt/nrt_status.h"
#include "nrt/nrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Starts recording the executions of `model`, to be written to `filename` at nrt_profile_stop. */
NRT_STATUS nrt_profile_start(nrt_model_t *model, const char *filename);

/** Stops the recording started for `filename` and writes it there (truncating an existing file). */
NRT_STATUS nrt_profile_stop(const char *filename);

#ifdef __cplusplus
}
#endif

#endif /* NRT_NRT_PROFILE_H */
