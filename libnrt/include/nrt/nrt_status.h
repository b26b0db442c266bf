/*
 * nrt/nrt_status.h - the status codes every libnrt call returns.
 *
 * Written for this project from the public facts of libnrt's API (names and values are ABI:
 * values never change, new ones are only appended). Part of the simdev-capable libnrt.so.1.
 */
#ifndef NRT_NRT_STATUS_H
#define NRT_NRT_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/** Result of a libnrt call (and, for asynchronous work, of the request it scheduled). */
typedef enum {
    NRT_SUCCESS = 0,                        /**< The call succeeded. */
    NRT_FAILURE = 1,                        /**< Generic failure; also a tensor-set lookup miss. */
    NRT_INVALID = 2,                        /**< Invalid argument: NULL, bad name, size, model or handle. */
    NRT_INVALID_HANDLE = 3,                 /**< Invalid handle (legacy code). */
    NRT_RESOURCE = 4,                       /**< A resource (device memory, queues) could not be allocated. */
    NRT_TIMEOUT = 5,                        /**< The operation timed out. */
    NRT_HW_ERROR = 6,                       /**< Hardware failure. */
    NRT_QUEUE_FULL = 7,                     /**< Execution queue full; nothing was scheduled, retry later. */
    NRT_LOAD_NOT_ENOUGH_NC = 9,             /**< Not enough NeuronCores to load the model. */
    NRT_UNSUPPORTED_NEFF_VERSION = 10,      /**< Model format version not supported. */
    NRT_FAIL_HOST_MEM_ALLOC = 11,           /**< Kept for backward compatibility; not returned. */
    NRT_UNINITIALIZED = 13,                 /**< Called before nrt_init. */
    NRT_CLOSED = 14,                        /**< Called after nrt_close. */
    NRT_QUEUE_EMPTY = 15,                   /**< A queue held no data. */
    NRT_EXEC_UNIT_UNRECOVERABLE = 101,      /**< An execution unit failed fatally; it refuses all later work. */
    NRT_EXEC_BAD_INPUT = 1002,              /**< Invalid input submitted to an execution. */
    NRT_EXEC_COMPLETED_WITH_NUM_ERR = 1003, /**< Finished with numerical errors (NaN). */
    NRT_EXEC_COMPLETED_WITH_ERR = 1004,     /**< Finished with other errors. */
    NRT_EXEC_NC_BUSY = 1005,                /**< The NeuronCore is in use elsewhere. */
    NRT_EXEC_OOB = 1006,                    /**< An indirect copy went out of bounds. */
    NRT_COLL_PENDING = 1100,                /**< A collective operation is still pending. */
    NRT_EXEC_HW_ERR_COLLECTIVES = 1200,     /**< Stuck in a collective operation. */
    NRT_EXEC_HW_ERR_HBM_UE = 1201,          /**< Uncorrectable HBM error. */
    NRT_EXEC_HW_ERR_NC_UE = 1202,           /**< NeuronCore on-chip memory parity error. */
    NRT_EXEC_HW_ERR_DMA_ABORT = 1203,       /**< Unrecoverable DMA engine error. */
    NRT_EXEC_SW_NQ_OVERFLOW = 1204,         /**< Software notification queue overflow. */
    NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE = 1205, /**< Repairable uncorrectable HBM error. */
    NRT_NETWORK_PROXY_FAILURE = 1206        /**< A network proxy operation failed. */
} NRT_STATUS;

/** The name of `status` (e.g. "NRT_INVALID"); a static string, never NULL. */
const char *nrt_get_status_as_str(NRT_STATUS status);

#ifdef __cplusplus
}
#endif

#endif /* NRT_NRT_STATUS_H */
