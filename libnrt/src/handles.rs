//! Handle registries: the opaque pointers handed to C (`nrt_model_t*`, `nrt_tensor_t*`,
//! `nrt_tensor_set_t*`, `nrt_sys_trace_config_t*`, `nrt_sys_trace_fetch_options_t*`) are keys
//! into these maps, never addresses of our objects.
//!
//! A handle is `HANDLE_BASE | id << 8 | kind`, with `id` from one process-wide counter that
//! never repeats: a non-canonical address that no real pointer can equal, so a pointer this
//! library did not hand out (or a stale one) is simply absent from the registry and refused
//! with NRT_INVALID — nothing is ever dereferenced. The kind byte lets a refusal say "this is a
//! tensor set, not a tensor".

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use runtime::sys_trace::{SysTraceConfig, SysTraceFetchOptions};
use runtime::{ModelHandle, NrtError, Tensor, TensorSet};
use shared::NrtStatus;

/// High bits of every handle (bits 48..63 set: not a canonical user-space address).
const HANDLE_BASE: usize = 0x7E57_0000_0000_0000;
/// Ids fit below the base.
const ID_LIMIT: usize = 1 << 40;

/// What a handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// `nrt_model_t*`.
    Model = 1,
    /// `nrt_tensor_t*`.
    Tensor = 2,
    /// `nrt_tensor_set_t*`.
    TensorSet = 3,
    /// `nrt_sys_trace_config_t*`.
    SysTraceConfig = 4,
    /// `nrt_sys_trace_fetch_options_t*`.
    FetchOptions = 5,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Model => "model",
            Self::Tensor => "tensor",
            Self::TensorSet => "tensor set",
            Self::SysTraceConfig => "system trace config",
            Self::FetchOptions => "system trace fetch options",
        }
    }

    fn of(handle: usize) -> Option<Self> {
        if handle & !(ID_LIMIT - 1) << 8 != HANDLE_BASE {
            return None;
        }
        match handle & 0xFF {
            1 => Some(Self::Model),
            2 => Some(Self::Tensor),
            3 => Some(Self::TensorSet),
            4 => Some(Self::SysTraceConfig),
            5 => Some(Self::FetchOptions),
            _ => None,
        }
    }
}

fn next_handle(kind: Kind) -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed) % ID_LIMIT;
    HANDLE_BASE | id << 8 | kind as usize
}

/// A loaded model's entry.
#[derive(Debug)]
pub struct ModelEntry {
    /// The runtime's handle.
    pub handle: ModelHandle,
    /// The runtime that loaded it: model ids start again in a runtime `nrt_init` starts after
    /// `nrt_close`, so the handle alone could name another runtime's model.
    pub runtime: runtime::tensor::RuntimeId,
}

/// A tensor's entry. The tensor can be replaced in place (`nrt_tensor_attach_buffer`), so
/// sets hold handles and resolve them at each execution.
#[derive(Debug)]
pub struct TensorEntry {
    /// The tensor.
    pub tensor: RwLock<Tensor>,
}

impl TensorEntry {
    /// The current tensor (a cheap clone sharing storage).
    pub fn get(&self) -> Tensor {
        self.tensor
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Bumped whenever a tensor handle stops naming the tensor it named (freed, or given another
/// buffer): a set resolved before then must be resolved again.
pub static TENSOR_GENERATION: AtomicU64 = AtomicU64::new(0);

/// A tensor set's entry: I/O name → tensor handle, and the runtime's set those handles
/// resolved to (reused by every execution until a member or any tensor handle changes).
#[derive(Debug, Default)]
pub struct SetEntry {
    /// The members and the cached resolution.
    pub state: Mutex<SetState>,
}

/// What a [`SetEntry`] guards.
#[derive(Debug, Default)]
pub struct SetState {
    /// The members.
    pub members: HashMap<String, usize>,
    /// The members resolved, and the [`TENSOR_GENERATION`] they were resolved at.
    pub resolved: Option<(u64, Arc<TensorSet>)>,
}

/// One kind of handle → its entry.
#[derive(Debug)]
pub struct Registry<T> {
    kind: Kind,
    map: RwLock<BTreeMap<usize, Arc<T>>>,
}

impl<T> Registry<T> {
    const fn new(kind: Kind) -> Self {
        Self {
            kind,
            map: RwLock::new(BTreeMap::new()),
        }
    }
}

fn refused(kind: Kind, handle: usize, what: &str) -> NrtError {
    let message = if handle == 0 {
        format!("{what} is NULL")
    } else {
        match Kind::of(handle) {
            Some(k) if k != kind => format!(
                "{what} {handle:#x} is a {} handle, not a {}",
                k.name(),
                kind.name()
            ),
            Some(_) => format!(
                "{what} {handle:#x} is not a live {} handle (already freed?)",
                kind.name()
            ),
            None => format!(
                "{what} {handle:#x} was not handed out by this library as a {}",
                kind.name()
            ),
        }
    };
    // The export's boundary logs the refusal with the function's name.
    NrtError::new(NrtStatus::Invalid, message)
}

impl<T> Registry<T> {
    /// Registers `entry`; returns its new handle.
    pub fn insert(&self, entry: T) -> *mut c_void {
        let h = next_handle(self.kind);
        self.map
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(h, Arc::new(entry));
        h as *mut c_void
    }

    /// The entry of `handle`.
    ///
    /// # Errors
    /// NRT_INVALID (logged) for NULL, a handle of another kind, a freed one or a stranger's
    /// pointer.
    pub fn get(&self, handle: *const c_void, what: &str) -> Result<Arc<T>, NrtError> {
        let h = handle as usize;
        self.map
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&h)
            .cloned()
            .ok_or_else(|| refused(self.kind, h, what))
    }

    /// Removes `handle`'s entry and returns it.
    ///
    /// # Errors
    /// As [`Registry::get`].
    pub fn remove(&self, handle: *const c_void, what: &str) -> Result<Arc<T>, NrtError> {
        let h = handle as usize;
        self.map
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&h)
            .ok_or_else(|| refused(self.kind, h, what))
    }

    /// Every (handle, entry).
    pub fn snapshot(&self) -> Vec<(usize, Arc<T>)> {
        self.map
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(h, e)| (*h, e.clone()))
            .collect()
    }
}

/// Loaded models.
pub static MODELS: Registry<ModelEntry> = Registry::new(Kind::Model);
/// Tensors.
pub static TENSORS: Registry<TensorEntry> = Registry::new(Kind::Tensor);
/// Tensor sets.
pub static SETS: Registry<SetEntry> = Registry::new(Kind::TensorSet);
/// System trace capture configurations.
pub static SYS_TRACE_CONFIGS: Registry<Mutex<SysTraceConfig>> = Registry::new(Kind::SysTraceConfig);
/// System trace fetch options.
pub static FETCH_OPTIONS: Registry<Mutex<SysTraceFetchOptions>> = Registry::new(Kind::FetchOptions);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strangers_stale_and_mistyped_handles_are_refused_by_kind() {
        let reg: Registry<u32> = Registry::new(Kind::Tensor);
        let h = reg.insert(7);
        assert_eq!(*reg.get(h, "tensor").unwrap(), 7);
        let local = 5u64;
        let e = reg
            .get((&local as *const u64).cast(), "tensor")
            .unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid);
        assert!(e.message.contains("not handed out"), "{e}");
        let e = reg.get(std::ptr::null(), "tensor").unwrap_err();
        assert!(e.message.contains("NULL"), "{e}");
        let set = next_handle(Kind::TensorSet) as *const c_void;
        assert!(
            reg.get(set, "tensor")
                .unwrap_err()
                .message
                .contains("tensor set handle")
        );
        reg.remove(h, "tensor").unwrap();
        let e = reg.get(h, "tensor").unwrap_err();
        assert!(e.message.contains("already freed"), "{e}");
        assert!(reg.remove(h, "tensor").is_err(), "a second free is refused");
    }

    #[test]
    fn handles_never_repeat_and_are_not_canonical_addresses() {
        let a = next_handle(Kind::Model);
        let b = next_handle(Kind::Model);
        assert_ne!(a, b);
        assert_eq!(Kind::of(a), Some(Kind::Model));
        assert!(a >= 0x0000_8000_0000_0000, "above user space");
    }
}
