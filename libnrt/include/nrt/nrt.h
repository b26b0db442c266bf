/*
 * nrt/nrt.h - the Neuron runtime's C API: lifecycle, topology, models, tensors, tensor sets
 * and synchronous execution.
 *
 * Written for this project from the public facts of libnrt's API (names, values, signatures
 * and layouts are ABI). This libnrt.so.1 runs on a Neuron device when /dev/neuron0 exists and
 * otherwise on simdev, an emulated device: NEURON_SIMDEV_SOCKET names a running one, else a
 * private one is started (the program named by NEURON_SIMDEV_BIN, else `simdev` beside this
 * library or in its ../bin, as `nrt install` lays it out, else on PATH). Models are simdev
 * model containers.
 *
 * Conventions: every call returns NRT_STATUS unless stated; a NULL where a pointer is required
 * is NRT_INVALID; a handle this library did not hand out, or already freed, is NRT_INVALID
 * (never dereferenced); calls made before nrt_init return NRT_UNINITIALIZED, after nrt_close
 * NRT_CLOSED. Logical core indices ("vnc", "lnc") count from 0 for the process's first core.
 */
#ifndef NRT_NRT_H
#define NRT_NRT_H

#include <stddef.h>
#include <stdint.h>
#include "nrt/nrt_status.h"
#include "nrt/nrt_version.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Version of this API. */
#define NRT_MAJOR_VERSION 2
#define NRT_MINOR_VERSION 0

/** A loaded model (opaque). */
typedef struct nrt_model nrt_model_t;
/** A tensor: device or host memory, or a slice of another tensor (opaque). */
typedef struct nrt_tensor nrt_tensor_t;
/** A tensor set: names (the model's I/O names) to tensors. */
typedef void nrt_tensor_set_t;

/** Where a tensor's memory lives. */
typedef enum {
    NRT_TENSOR_PLACEMENT_DEVICE = 0, /**< Device memory of a logical core. */
    NRT_TENSOR_PLACEMENT_HOST = 1    /**< Host memory. */
} nrt_tensor_placement_t;

/** The framework calling nrt_init (informs tools only). */
typedef enum {
    NRT_FRAMEWORK_TYPE_INVALID = 0,
    NRT_FRAMEWORK_TYPE_NO_FW = 1,      /**< A direct user of this API. */
    NRT_FRAMEWORK_TYPE_TENSORFLOW = 2,
    NRT_FRAMEWORK_TYPE_PYTORCH = 3,
    NRT_FRAMEWORK_TYPE_MXNET = 4,
    NRT_FRAMEWORK_TYPE_PRECHECK = 5
} nrt_framework_type_t;

/** Instance families (nrt_instance_info_t::family). */
enum {
    NRT_INSTANCE_UNKNOWN = 0,
    NRT_INSTANCE_INF1 = 1,
    NRT_INSTANCE_TRN1 = 2,
    NRT_INSTANCE_TRN1N = 3,
    NRT_INSTANCE_INF2 = 4,
    NRT_INSTANCE_TRN2 = 5,
    NRT_INSTANCE_TRN2N = 6,
    NRT_INSTANCE_INF2E = 7,
    NRT_INSTANCE_TRN2P = 8,
    NRT_INSTANCE_TRN2U = 9,
    NRT_INSTANCE_TRN2E = 10,
    NRT_INSTANCE_TRN2EU = 11,
    NRT_INSTANCE_TRN2AC = 12,
    NRT_INSTANCE_TRN2UAC = 13,
    NRT_INSTANCE_TRN3 = 14,
    NRT_INSTANCE_TRN3PDS98 = 15,
    NRT_INSTANCE_TRN2EN = 16,
    NRT_INSTANCE_TRN3E = 17
};

/** Instance sizes (nrt_instance_info_t::size). */
enum {
    NRT_INSTANCE_SIZE_1XL = 0,
    NRT_INSTANCE_SIZE_2XL = 1,
    NRT_INSTANCE_SIZE_4XL = 2,
    NRT_INSTANCE_SIZE_6XL = 3,
    NRT_INSTANCE_SIZE_8XL = 4,
    NRT_INSTANCE_SIZE_24XL = 5,
    NRT_INSTANCE_SIZE_32XL = 6,
    NRT_INSTANCE_SIZE_48XL = 7,
    NRT_INSTANCE_SIZE_3XL = 8,
    NRT_INSTANCE_SIZE_UNKNOWN = 9,
    NRT_INSTANCE_SIZE_NUM = 9
};

/** Element types of model tensors (values are not contiguous with the old list: ABI). */
typedef enum nrt_dtype {
    NRT_DTYPE_UNKNOWN = 0x0,
    NRT_DTYPE_INVALID = 0x0,
    NRT_DTYPE_UINT64 = 0x1,
    NRT_DTYPE_INT8 = 0x2,
    NRT_DTYPE_UINT8 = 0x3,
    NRT_DTYPE_INT16 = 0x4,
    NRT_DTYPE_UINT16 = 0x5,
    NRT_DTYPE_BFLOAT16 = 0x6,
    NRT_DTYPE_FLOAT16 = 0x7,
    NRT_DTYPE_INT32 = 0x8,
    NRT_DTYPE_UINT32 = 0x9,
    NRT_DTYPE_FLOAT32 = 0xA,
    NRT_DTYPE_FP32R = 0xB,
    NRT_DTYPE_INT64 = 0xC,
    NRT_DTYPE_FP8_E3 = 0xD,
    NRT_DTYPE_FP8_E4 = 0xE,
    NRT_DTYPE_FP8_E5 = 0xF
} nrt_dtype_t;

/** Reduction of a collective operation. */
typedef enum nrt_op_type {
    NRT_OP_ADD = 0x0,
    NRT_OP_FMA = 0x1,
    NRT_OP_MAX = 0x2,
    NRT_OP_MIN = 0x3,
    NRT_OP_INVALID = 0xF
} nrt_op_type_t;

/** Collective communication operation. */
typedef enum nrt_cc_op_type {
    NRT_CC_ALLGATHER = 0,
    NRT_CC_ALLREDUCE = 1,
    NRT_CC_REDUCESCATTER = 2
} nrt_cc_op_type_t;

/** A prepared collective operation (nrta_cc_prepare). Opaque. */
typedef struct nrt_cc_context nrt_cc_context_t;

/** A collective's communicator: this rank's place in its replica group (32 bytes). */
typedef struct nrt_cc_comm {
    uint32_t *replica_group;    /**< The group's ranks. */
    uint32_t rank;              /**< This rank. */
    uint32_t rank_n;            /**< Ranks in the group. */
    uint32_t ctx_device_id;     /**< This device's id among the context's devices. */
    uint32_t ctx_device_count;  /**< Devices in the context. */
    uint32_t vnc;               /**< The logical core. */
} nrt_cc_comm_t;

/** A list of tensors (16 bytes). */
typedef struct nrt_tensor_list {
    nrt_tensor_t **tensors;
    size_t num_tensors;
} nrt_tensor_list_t;

/** The instance this process runs on (32 bytes; fields are only ever appended). */
typedef struct nrt_instance_info {
    uint32_t family;            /**< An NRT_INSTANCE_* value. */
    uint32_t size;              /**< An NRT_INSTANCE_SIZE_* value. */
    char arch_name[16];         /**< Device generation, NUL-terminated (e.g. "trn1"). */
    char device_revision[8];    /**< Device revision, NUL-terminated. */
} nrt_instance_info_t;

/** Where a device tensor's bytes are (24 bytes). */
typedef struct nrt_tensor_device_allocation_info {
    uint64_t physical_address;  /**< Device address of the tensor's first byte. */
    size_t size;                /**< Size of the allocation holding it (may exceed the tensor's). */
    int hbm_index;              /**< The HBM holding it. */
} nrt_tensor_device_allocation_info_t;

/** Device memory of one logical core (16 bytes; fields are only ever appended). */
typedef struct nrt_vnc_memory_stats {
    size_t bytes_used;          /**< Bytes held by this process's tensors and models. */
    size_t bytes_limit;         /**< Bytes the core has. */
} nrt_vnc_memory_stats_t;

/** What nrt_get_model_info reports (4 bytes; fields are only ever appended). */
typedef struct nrt_model_info {
    uint32_t vnc;               /**< The logical core the model is loaded on. */
} nrt_model_info_t;

/* ---- lifecycle and topology ---- */

/**
 * Initialises the runtime: reads the NEURON_RT_* environment, opens the device and reserves
 * the logical cores. Once per process. Direct users pass NRT_FRAMEWORK_TYPE_NO_FW, "", "".
 */
NRT_STATUS nrt_init(nrt_framework_type_t framework, const char *fw_version, const char *fal_version);

/** Closes the runtime: stops its workers, unloads models, releases the cores. */
void nrt_close(void);

/** Logical cores of the device, regardless of NEURON_RT_VISIBLE_CORES. Callable before nrt_init. */
NRT_STATUS nrt_get_total_vnc_count(uint32_t *vnc_count);

/** Deprecated name of nrt_get_total_vnc_count. */
NRT_STATUS nrt_get_total_nc_count(uint32_t *nc_count);

/** Logical cores this process has (or, before nrt_init, would have). Callable before nrt_init. */
NRT_STATUS nrt_get_visible_vnc_count(uint32_t *vnc_count);

/** Deprecated name of nrt_get_visible_vnc_count. */
NRT_STATUS nrt_get_visible_nc_count(uint32_t *nc_count);

/** Fills `info` (at most `instance_info_len` bytes) with the instance family, size and arch. */
NRT_STATUS nrt_get_instance_info(nrt_instance_info_t *info, size_t instance_info_len);

/**
 * The host's id of Neuron device `neuron_dev` as this process sees it (a container may see
 * host devices renumbered); NRT_INVALID for a device this process does not have. simdev is
 * device 0, not renumbered.
 */
NRT_STATUS nrt_host_device_id_get(int neuron_dev, uint32_t *host_device_id);

/**
 * The routing-ID table indexed by host device id: `*count` holds the capacity of
 * `host_did_to_rid_map` on entry and the entries written on return. With simdev (one device,
 * host id 0, routing id 0) one entry; NRT_RESOURCE, with `*count` set to the entries needed,
 * when the array is too small.
 */
NRT_STATUS nrt_host_device_id_rid_map_get(uint32_t *count, uint32_t *host_did_to_rid_map);

/**
 * Device memory used and available on logical core `vnc`. Writes at most `stats_size_in` bytes
 * of `stats` and the number written to `*stats_size_out`.
 */
NRT_STATUS nrt_get_vnc_memory_stats(uint32_t vnc, nrt_vnc_memory_stats_t *stats,
                                    size_t stats_size_in, size_t *stats_size_out);

/* ---- models ---- */

/**
 * Loads a model (`size` bytes at `neff_bytes`, copied) on logical core `vnc` (-1: the first).
 * `vnc_count` is deprecated: pass -1. On success `*model` is the new model's handle.
 */
NRT_STATUS nrt_load(const void *neff_bytes, size_t size, int32_t vnc, int32_t vnc_count,
                    nrt_model_t **model);

/**
 * Loads a model with collectives as rank `ctx_device_id` of `ctx_device_count`. A group of one
 * loads like nrt_load; a larger group is NRT_INVALID (collectives are not simulated yet).
 */
NRT_STATUS nrt_load_collectives(const void *neff_bytes, size_t size, int32_t vnc, int32_t vnc_count,
                                uint32_t ctx_device_id, uint32_t ctx_device_count,
                                nrt_model_t **model);

/*
 * The global communicator of rank `g_device_id` of `g_device_count` on logical core `vnc`
 * (nrt_build_global_comm for NEFF collectives, nrt_cc_global_comm_init for host-initiated
 * ones). simdev is one device: a group of one (rank 0) needs nothing built and succeeds; a
 * larger group is NRT_INVALID (collectives across ranks are not simulated yet).
 */
NRT_STATUS nrt_build_global_comm(int32_t vnc, uint32_t g_device_id, uint32_t g_device_count);
NRT_STATUS nrt_cc_global_comm_init(uint32_t vnc, uint32_t g_device_id, uint32_t g_device_count);

/** Unloads a model after its running executions; the handle is invalid afterwards. */
NRT_STATUS nrt_unload(nrt_model_t *model);

/**
 * Runs the model once, synchronously, binding tensors by the model's I/O names. Host tensors
 * are copied to and from the device. Several threads may execute one model at once.
 */
NRT_STATUS nrt_execute(nrt_model_t *model, const nrt_tensor_set_t *input_set,
                       nrt_tensor_set_t *output_set);

/**
 * nrt_execute `repeat_count` times feeding outputs back as inputs. As in libnrt, a count above
 * 1 is refused (NRT_INVALID, "Supports for loops on the host is deprecated") and a count of 1
 * or less runs the model once.
 */
NRT_STATUS nrt_execute_repeat(nrt_model_t *model, const nrt_tensor_set_t *input_set,
                              nrt_tensor_set_t *output_set, int repeat_count);

/**
 * Fills `info` (at most `info_size_in` bytes) with the model's logical core; the number of
 * bytes written goes to `*info_size_out`.
 */
NRT_STATUS nrt_get_model_info(const nrt_model_t *model, nrt_model_info_t *info,
                              size_t info_size_in, size_t *info_size_out);

/** Logical cores the model uses (deprecated: always 1). */
NRT_STATUS nrt_get_model_vnc_count(const nrt_model_t *model, uint32_t *vnc_count);

/** Deprecated name of nrt_get_model_vnc_count. */
NRT_STATUS nrt_get_model_nc_count(const nrt_model_t *model, uint32_t *nc_count);

/**
 * Staged copies of the model, the suggested number of threads calling nrt_execute on it
 * (deprecated): 1 — the model is staged once, and concurrent nrt_execute calls on it are
 * pipelined through its logical core's request slots.
 */
NRT_STATUS nrt_get_model_instance_count(nrt_model_t *model, uint32_t *instance_count);

/* ---- tensors ---- */

/**
 * Allocates `size` bytes of device memory of logical core `vnc`, or host memory (pass -1 as
 * `vnc`), zero-filled. `name` (may be NULL) is for logs only: any bytes, cut to
 * NRT_TENSOR_NAME_MAX - 1.
 */
NRT_STATUS nrt_tensor_allocate(nrt_tensor_placement_t tensor_placement, int vnc, size_t size,
                               const char *name, nrt_tensor_t **tensor);

/** Frees a tensor and sets `*tensor` to NULL; its memory lives on while slices of it exist. */
void nrt_tensor_free(nrt_tensor_t **tensor);

/** Copies `size` bytes from byte `offset` of the tensor into `buf`. */
NRT_STATUS nrt_tensor_read(const nrt_tensor_t *tensor, void *buf, size_t offset, size_t size);

/** Copies `size` bytes from `buf` to byte `offset` of the tensor. */
NRT_STATUS nrt_tensor_write(nrt_tensor_t *tensor, const void *buf, size_t offset, size_t size);

/** Byte offset of a batch operation in its tensor. */
typedef uint64_t nrt_tensor_batch_offset_t;
/** Bytes of a batch operation. */
typedef uint64_t nrt_tensor_batch_size_t;

/** One operation of a batch: `size` bytes at byte `offset` of the tensor, to or from `buffer`. */
typedef struct nrt_tensor_batch_op {
    nrt_tensor_batch_offset_t offset;
    nrt_tensor_batch_size_t size;
    void *buffer;
} nrt_tensor_batch_op_t;

/** The `num_ops` operations at `ops` on one tensor. */
typedef struct nrt_tensor_batch {
    const nrt_tensor_t *tensor;
    const nrt_tensor_batch_op_t *ops;
    uint32_t num_ops;
} nrt_tensor_batch_t;

/*
 * Runs every operation of `num_batches` batches in order: read_batch copies from the tensors
 * into the buffers, write_batch from the buffers into the tensors. Every operation is checked
 * first (a live tensor, a range inside it, a buffer where there are bytes): a batch with one
 * wrong operation copies nothing, and the error names it (`batches[i].ops[j]`). A read waits
 * for the implicit-async executions using its tensor, as nrt_tensor_read does; like it, it
 * does not wait for requests scheduled with nrta_* (wait for their completion first).
 *
 * The 2.34.10 signature. A caller built against the earlier one, with a third argument
 * `bool unsafe` (an older header, or a dlsym'd pointer of that type), is served the same: the
 * third argument is never read, and tensors are always tracked as above.
 */
NRT_STATUS nrt_tensor_read_batch(const nrt_tensor_batch_t *batches, uint64_t num_batches);
NRT_STATUS nrt_tensor_write_batch(const nrt_tensor_batch_t *batches, uint64_t num_batches);

/** Copies `size` bytes between tensors; device tensors must be on the same logical core. */
NRT_STATUS nrt_tensor_copy(const nrt_tensor_t *src, size_t src_offset, nrt_tensor_t *dst,
                           size_t dst_offset, size_t size);

/** Sets `size` bytes from byte `offset` of the tensor to `value` (converted to a byte). */
NRT_STATUS nrt_tensor_memset(nrt_tensor_t *tensor, uint64_t offset, int value, size_t size);

/** The tensor's size in bytes (0 for an invalid handle). */
size_t nrt_tensor_get_size(const nrt_tensor_t *tensor);

/** The host address of the tensor's memory (inside the device mapping for device tensors), or NULL. */
void *nrt_tensor_get_va(const nrt_tensor_t *tensor);

/**
 * A new tensor aliasing `size` bytes of `tensor_source` from byte `offset`: no copy, the
 * memory is shared and lives as long as either tensor.
 */
NRT_STATUS nrt_tensor_allocate_slice(const nrt_tensor_t *tensor_source, size_t offset, size_t size,
                                     const char *name, nrt_tensor_t **tensor_slice);

/** A tensor with no memory, to be given a caller-owned buffer with nrt_tensor_attach_buffer. */
NRT_STATUS nrt_tensor_allocate_empty(const char *name, nrt_tensor_t **tensor);

/**
 * Makes the tensor use `size` bytes at `buffer`, which the caller owns and must keep alive
 * while the tensor (or a slice of it) exists; it is never freed by the library.
 */
NRT_STATUS nrt_tensor_attach_buffer(nrt_tensor_t *tensor, void *buffer, size_t size);

/** Physical address, allocation size and HBM of a device tensor. */
NRT_STATUS nrt_tensor_get_device_allocation_info(const nrt_tensor_t *tensor,
                                                 nrt_tensor_device_allocation_info_t *alloc_info);

/** The logical core of a device tensor; -1 for a host tensor or an attached buffer. */
NRT_STATUS nrt_tensor_get_lnc_index(const nrt_tensor_t *tensor, int *lnc_idx);

/* ---- pinned host buffers ---- */

/**
 * The kind of pages of a pinned host buffer. The type's name and values are libnrt's (runtime
 * 2.34.10); the enumerators' spellings are not public, so these are this project's: a program
 * passing the values (or its own constants) builds against both, one spelling libnrt's
 * enumerators builds against libnrt's header.
 */
typedef enum {
    NRT_PINNED_ALLOC_TYPE_MALLOC = 0,      /**< Small pages, page-aligned. */
    NRT_PINNED_ALLOC_TYPE_HUGEPAGE_2M = 1, /**< 2 MiB pages; the size rounded up to them. */
    NRT_PINNED_ALLOC_TYPE_HUGEPAGE_1G = 2  /**< 1 GiB pages; the size rounded up to them. */
} nrt_pinned_alloc_type_t;

/**
 * `size` bytes of host memory locked in memory, on pages of `type`; free with
 * nrt_pinned_free. NULL (logged) for a size of 0, a type outside the enum or a size the system
 * cannot map. Callable at any time (no nrt_init needed). This library does not need the
 * buffer pinned (simdev copies through shared memory), so a buffer the process may not lock
 * (RLIMIT_MEMLOCK) is returned unlocked, and a huge-page buffer on a system without huge pages
 * of that size reserved is ordinary memory aligned to 2 MiB and advised as transparent huge
 * pages; either is logged as a warning (NEURON_RT_LOG_LEVEL=WARN).
 */
void *nrt_pinned_malloc(size_t size, nrt_pinned_alloc_type_t type);

/** Frees a buffer nrt_pinned_malloc returned; NULL does nothing; another pointer is logged. */
void nrt_pinned_free(void *ptr);

/**
 * Waits until `expected_completion_count` executions have written `output_tensor` as an
 * output since its count was last reset, for at most `timeout` microseconds (negative:
 * unbounded, with a warning after 30 s; 0: a poll). NRT_SUCCESS when they have, NRT_TIMEOUT
 * when not, NRT_INVALID for NULL or a freed handle. An execution counts once its outputs are
 * written (it ended with NRT_SUCCESS or NRT_EXEC_COMPLETED_WITH_NUM_ERR); a failed one does
 * not. The count is the handle's: a slice has its own. Callable at any time (no lifecycle
 * gate), like libnrt's.
 */
NRT_STATUS nrt_tensor_check_output_completion(const nrt_tensor_t *output_tensor, int64_t timeout,
                                              uint64_t expected_completion_count);

/** Sets `output_tensor`'s output completion count back to 0. */
NRT_STATUS nrt_tensor_reset_output_completion(nrt_tensor_t *output_tensor);

/**
 * A file descriptor that maps the device memory at `va` (a device tensor's address from
 * nrt_tensor_get_va, `size` bytes): on simdev the memory's memfd, mapped from offset 0 at `va`,
 * whose size is fixed (ftruncate is refused). The caller closes it. On /dev/neuron this
 * runtime exports no memory: NRT_INVALID.
 */
NRT_STATUS nrt_get_dmabuf_fd(uint64_t va, uint64_t size, int *fd);

/**
 * nrt_get_dmabuf_fd for any `va` inside a device tensor's mapping: `*offset` is where `va`
 * lies in the memory `*fd` maps (counted from the start of the allocation, which may be more
 * than a page: the descriptor plus the offset is the address either way). The caller closes
 * it.
 */
NRT_STATUS nrt_get_dmabuf_fd_v2(uint64_t va, uint64_t size, int *fd, uint64_t *offset);

/**
 * The PCI BDF of the EFA NIC attached to the device whose memory `va` lies in, as a
 * NUL-terminated string in `efa_bdf` (`*len` bytes). NRT_INVALID for an address outside every
 * device tensor; NRT_FAILURE when no NIC is attached: always here (simdev has no network, and
 * this runtime does not read a Neuron device's PCI topology).
 */
NRT_STATUS nrt_get_attached_efa_bdf(const void *va, char *efa_bdf, size_t *len);

/**
 * Where HBM region `hbm_idx` of device `device_id` is mapped whole into this process.
 * NRT_INVALID, unsupported: this runtime maps each device allocation alone
 * (nrt_tensor_get_va gives a tensor's address).
 */
NRT_STATUS nrt_get_hbm_mmap_va(int device_id, int hbm_idx, void **addr, size_t *size);

/* ---- tensor sets ---- */

/** A new, empty tensor set. */
NRT_STATUS nrt_allocate_tensor_set(nrt_tensor_set_t **result);

/** Frees the set (not its tensors) and sets `*tensor_set` to NULL. */
void nrt_destroy_tensor_set(nrt_tensor_set_t **tensor_set);

/**
 * Adds `tensor` under `tensor_name` (a model I/O name), replacing an earlier one of that name.
 * The tensor must stay allocated while it is in the set.
 */
NRT_STATUS nrt_add_tensor_to_tensor_set(nrt_tensor_set_t *tensor_set, const char *tensor_name,
                                        nrt_tensor_t *tensor);

/** The tensor under `tensor_name`; NRT_FAILURE, and `*tensor` untouched, when there is none. */
NRT_STATUS nrt_get_tensor_from_tensor_set(nrt_tensor_set_t *tensor_set, const char *tensor_name,
                                          nrt_tensor_t **tensor);

#ifdef __cplusplus
}
#endif

#endif /* NRT_NRT_H */
