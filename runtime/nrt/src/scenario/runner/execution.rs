//! `execute` and `join`: an `execute` step's executions on one or more threads, each thread
//! with its own tensors ("slots"), through the sync API (under the implicit async pool:
//! `execute`, `async_drain`, and the status the completion callback gave that job) or the
//! explicit async API (`execute_schedule` + `wait`, keeping up to
//! `inflight` requests outstanding and waiting for the oldest on NRT_QUEUE_FULL).
//!
//! Each execution writes a distinct input (from the seed and its index) and clears the output
//! first; delivered outputs are checked against the model's reference. Execution indices come
//! from one shared counter, so records sort into execution order whatever the thread.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use runtime::{ModelHandle, Placement, Runtime, ScheduledExecution, TensorSet};
use shared::NrtStatus;

use super::{Runner, status_of};
use crate::scenario::models::BuiltModel;
use crate::scenario::spec::{ExecMode, ExecuteStep, JoinStep};

/// One execution's result.
#[derive(Debug, Clone)]
pub(super) struct ExecRecord {
    /// The execution's index (from 0).
    pub(super) e: u64,
    /// Its status.
    pub(super) status: NrtStatus,
    /// The error message (empty on success).
    pub(super) message: String,
    /// Seconds the call took (async: schedule to wait).
    pub(super) secs: f64,
    /// The output check, if the execution delivered outputs and they were checked.
    pub(super) output: Option<Result<(), String>>,
}

/// An `execute` step's results.
#[derive(Debug, Default)]
pub(super) struct ExecOutcome {
    /// Every execution, sorted by index.
    pub(super) records: Vec<ExecRecord>,
    /// Async: schedules refused with NRT_QUEUE_FULL.
    pub(super) queue_full: u64,
    /// Set-up failures (tensors, inputs).
    pub(super) errors: Vec<String>,
    /// Seconds the whole step took.
    pub(super) seconds: f64,
}

/// How an `execute` step runs.
#[derive(Debug, Clone)]
pub(super) struct ExecParams {
    /// Executions.
    pub(super) count: u64,
    /// Threads sharing them.
    pub(super) threads: u32,
    /// The explicit async API.
    pub(super) asynchronous: bool,
    /// Host tensors.
    pub(super) host: bool,
    /// The logical core the tensors are allocated on.
    pub(super) tensors_vnc: u32,
    /// The runtime that allocates the tensors, if not the one that executes (`tensors_from`).
    pub(super) tensors_from: Option<Arc<Runtime>>,
    /// Check delivered outputs.
    pub(super) check: bool,
    /// Async: requests one thread keeps outstanding.
    pub(super) inflight: usize,
    /// The input patterns' seed.
    pub(super) seed: u64,
    /// Under the implicit async pool: the statuses its completion callback reports.
    pub(super) jobs: Option<Arc<JobStatuses>>,
}

/// The statuses the implicit async pool's completion callback reported, by (logical core,
/// job id), until taken.
#[derive(Debug, Default)]
pub(super) struct JobStatuses(std::sync::Mutex<std::collections::HashMap<(u32, u64), NrtStatus>>);

impl JobStatuses {
    /// The callback to register: records each job's status.
    pub(super) fn callback(self: &Arc<Self>) -> runtime::async_pool::AsyncCallback {
        let jobs = self.clone();
        Arc::new(move |_, vnc, job, status| {
            jobs.lock().insert((vnc, job), status);
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<(u32, u64), NrtStatus>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Job `job`'s status on `vnc`, once (`None` if the callback has not reported it).
    fn take(&self, vnc: u32, job: u64) -> Option<NrtStatus> {
        self.lock().remove(&(vnc, job))
    }
}

/// A background `execute` step.
#[derive(Debug)]
pub(super) struct Background {
    /// The `execute` step's number.
    pub(super) step_no: usize,
    /// The step (its expectations are judged at `join`).
    step: ExecuteStep,
    /// The thread running it.
    pub(super) thread: std::thread::JoinHandle<ExecOutcome>,
}

/// Runs an `execute` step's executions.
fn run_execute(rt: &Runtime, m: &BuiltModel, h: ModelHandle, p: &ExecParams) -> ExecOutcome {
    let start = Instant::now();
    let next = AtomicU64::new(0);
    let per_thread: Vec<ExecOutcome> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..p.threads.max(1))
            .map(|_| {
                let next = &next;
                s.spawn(move || {
                    if p.asynchronous {
                        exec_thread_async(rt, m, h, p, next)
                    } else {
                        exec_thread_sync(rt, m, h, p, next)
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|t| {
                t.join().unwrap_or_else(|_| ExecOutcome {
                    errors: vec!["an execution thread panicked".into()],
                    ..ExecOutcome::default()
                })
            })
            .collect()
    });
    let mut out = ExecOutcome::default();
    for t in per_thread {
        out.records.extend(t.records);
        out.errors.extend(t.errors);
        out.queue_full += t.queue_full;
    }
    out.records.sort_by_key(|r| r.e);
    out.seconds = start.elapsed().as_secs_f64();
    out
}

/// One thread's tensors for one execution in flight.
pub(super) struct Slot {
    /// One tensor per model input, in the model's order.
    inputs: Vec<runtime::Tensor>,
    /// One tensor per model output.
    outputs: Vec<runtime::Tensor>,
    /// The input set.
    pub(super) ins: TensorSet,
    /// The output set.
    pub(super) outs: TensorSet,
}

/// Allocates a slot's tensors where `p` says (with `p.tensors_from` if set, else `rt`).
pub(super) fn slot(rt: &Runtime, m: &BuiltModel, p: &ExecParams) -> Result<Slot, String> {
    let rt = p.tensors_from.as_deref().unwrap_or(rt);
    let placement = if p.host {
        Placement::Host
    } else {
        Placement::Device { vnc: p.tensors_vnc }
    };
    let allocate = |io: &crate::scenario::models::Io, set: &mut TensorSet| {
        let t = rt
            .tensor_allocate(placement, io.size.max(1), &io.name)
            .map_err(|e| format!("allocating tensor {:?}: {e}", io.name))?;
        set.add(&io.name, &t);
        Ok::<_, String>(t)
    };
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    let inputs = m
        .inputs
        .iter()
        .map(|io| allocate(io, &mut ins))
        .collect::<Result<_, _>>()?;
    let outputs = m
        .outputs
        .iter()
        .map(|io| allocate(io, &mut outs))
        .collect::<Result<_, _>>()?;
    Ok(Slot {
        inputs,
        outputs,
        ins,
        outs,
    })
}

/// Writes execution `e`'s inputs and clears the outputs; returns the inputs.
pub(super) fn prepare(
    m: &BuiltModel,
    p: &ExecParams,
    s: &Slot,
    e: u64,
) -> Result<Vec<Vec<u8>>, String> {
    let inputs = m.input(p.seed, e);
    for (t, bytes) in s.inputs.iter().zip(&inputs) {
        t.write(bytes, 0)
            .map_err(|err| format!("writing input {:?} of execution {e}: {err}", t.name()))?;
    }
    for t in &s.outputs {
        let zeros = vec![0u8; usize::try_from(t.size()).unwrap_or(0)];
        t.write(&zeros, 0)
            .map_err(|err| format!("clearing output {:?} of execution {e}: {err}", t.name()))?;
    }
    Ok(inputs)
}

/// Checks execution `e`'s output if it delivered one and `p` asks for it.
pub(super) fn verify(
    m: &BuiltModel,
    p: &ExecParams,
    s: &Slot,
    e: u64,
    status: NrtStatus,
    inputs: &[Vec<u8>],
) -> Option<Result<(), String>> {
    let delivered = matches!(
        status,
        NrtStatus::Success | NrtStatus::ExecCompletedWithNumErr
    );
    if !p.check || !m.checkable() || !delivered {
        return None;
    }
    let outputs: Result<Vec<Vec<u8>>, String> = s
        .outputs
        .iter()
        .map(|t| {
            let mut out = vec![0u8; usize::try_from(t.size()).unwrap_or(0)];
            t.read(&mut out, 0)
                .map(|()| out)
                .map_err(|err| format!("reading output {:?} of execution {e}: {err}", t.name()))
        })
        .collect();
    Some(outputs.and_then(|outs| m.check(p.seed, e, inputs, &outs)))
}

/// One thread of a sync `execute` step.
fn exec_thread_sync(
    rt: &Runtime,
    m: &BuiltModel,
    h: ModelHandle,
    p: &ExecParams,
    next: &AtomicU64,
) -> ExecOutcome {
    let mut out = ExecOutcome::default();
    let s = match slot(rt, m, p) {
        Ok(s) => s,
        Err(e) => {
            out.errors.push(e);
            return out;
        }
    };
    loop {
        let e = next.fetch_add(1, Ordering::Relaxed);
        if e >= p.count {
            break;
        }
        let input = match prepare(m, p, &s, e) {
            Ok(i) => i,
            Err(err) => {
                out.errors.push(err);
                continue;
            }
        };
        let t0 = Instant::now();
        let (status, message) = match &p.jobs {
            None => {
                let r = rt.execute(h, &s.ins, &s.outs);
                (
                    status_of(&r),
                    r.err().map(|e| e.message).unwrap_or_default(),
                )
            }
            // The implicit async pool returns at submission: the execution's status is the
            // one its completion callback reports, which has run when the drain returns.
            Some(jobs) => match rt.execute_implicit(h, &s.ins, &s.outs) {
                Err(err) => (err.status, err.message),
                Ok(job) => {
                    rt.async_drain(h.vnc);
                    match jobs.take(h.vnc, job) {
                        Some(NrtStatus::Success) => (NrtStatus::Success, String::new()),
                        Some(st) => (
                            st,
                            format!(
                                "job {job} completed with {st} (the completion callback's status)"
                            ),
                        ),
                        None => (
                            NrtStatus::Failure,
                            format!(
                                "job {job}: drained, but the completion callback never reported it"
                            ),
                        ),
                    }
                }
            },
        };
        let secs = t0.elapsed().as_secs_f64();
        out.records.push(ExecRecord {
            e,
            status,
            message,
            secs,
            output: verify(m, p, &s, e, status, &input),
        });
    }
    out
}

/// Requests outstanding: (execution, slot, scheduled at, request, its inputs).
type Pending = VecDeque<(u64, usize, Instant, ScheduledExecution, Vec<Vec<u8>>)>;

/// One thread of an async `execute` step: keeps up to `p.inflight` requests outstanding.
fn exec_thread_async(
    rt: &Runtime,
    m: &BuiltModel,
    h: ModelHandle,
    p: &ExecParams,
    next: &AtomicU64,
) -> ExecOutcome {
    let mut out = ExecOutcome::default();
    let mut slots = Vec::new();
    for _ in 0..p.inflight.max(1) {
        match slot(rt, m, p) {
            Ok(s) => slots.push(s),
            Err(e) => {
                out.errors.push(e);
                return out;
            }
        }
    }
    let mut free: Vec<usize> = (0..slots.len()).rev().collect();
    let mut pending: Pending = VecDeque::new();
    let complete = |pending: &mut Pending, free: &mut Vec<usize>, out: &mut ExecOutcome| {
        let Some((e, i, t0, req, input)) = pending.pop_front() else {
            return;
        };
        let (status, message) = match rt.wait(&req) {
            Ok(s) => (s, String::new()),
            Err(err) => (err.status, err.message),
        };
        out.records.push(ExecRecord {
            e,
            status,
            message,
            secs: t0.elapsed().as_secs_f64(),
            output: verify(m, p, &slots[i], e, status, &input),
        });
        free.push(i);
    };
    loop {
        let e = next.fetch_add(1, Ordering::Relaxed);
        if e >= p.count {
            break;
        }
        if free.is_empty() {
            complete(&mut pending, &mut free, &mut out);
        }
        let Some(i) = free.pop() else {
            out.errors.push("no free tensor slot".into());
            break;
        };
        let input = match prepare(m, p, &slots[i], e) {
            Ok(v) => v,
            Err(err) => {
                out.errors.push(err);
                free.push(i);
                continue;
            }
        };
        let retry_until = Instant::now() + Duration::from_secs(10);
        loop {
            let t0 = Instant::now();
            match rt.execute_schedule(h, &slots[i].ins, &slots[i].outs) {
                Ok(req) => {
                    pending.push_back((e, i, t0, req, input));
                    break;
                }
                Err(err) if err.status == NrtStatus::QueueFull && Instant::now() < retry_until => {
                    out.queue_full += 1;
                    if pending.is_empty() {
                        std::thread::sleep(Duration::from_millis(1));
                    } else {
                        complete(&mut pending, &mut free, &mut out);
                    }
                }
                Err(err) => {
                    out.records.push(ExecRecord {
                        e,
                        status: err.status,
                        message: err.message,
                        secs: t0.elapsed().as_secs_f64(),
                        output: None,
                    });
                    free.push(i);
                    break;
                }
            }
        }
    }
    while !pending.is_empty() {
        complete(&mut pending, &mut free, &mut out);
    }
    out
}

impl Runner<'_> {
    /// `execute`: runs now and judges, or starts a background thread that `join` judges.
    pub(super) fn execute(&mut self, n: usize, at: &str, step: &ExecuteStep) {
        let Some(rt) = self.runtime(at) else { return };
        let name = step.model.clone().unwrap_or_default();
        let Some(l) = self.handles.get(&name).cloned() else {
            self.rec
                .fail(at, format!("model {name:?} is loaded"), "it is not");
            return;
        };
        let tensors_from = match &step.tensors_from {
            Some(n) => match self.other_runtime(at, n) {
                Some(o) => Some(o),
                None => return,
            },
            None => None,
        };
        let p = ExecParams {
            tensors_from,
            count: step.count.unwrap_or(1),
            threads: step.threads.unwrap_or(1),
            asynchronous: step.mode == ExecMode::Async,
            host: step.host_tensors.unwrap_or(false),
            tensors_vnc: step.tensors_on_vnc.unwrap_or(l.handle.vnc),
            check: step.check_outputs.unwrap_or(true),
            inflight: step.inflight.map_or(2 * self.sc.runtime.xu_capacity, |i| {
                usize::try_from(i).unwrap_or(1)
            }),
            seed: self.sc.device.seed,
            jobs: rt.implicit_async().then(|| self.jobs.clone()),
        };
        if let Some(bg) = &step.background {
            let model = l.model.clone();
            let thread = std::thread::spawn(move || run_execute(&rt, &model, l.handle, &p));
            self.background.insert(
                bg.clone(),
                Background {
                    step_no: n,
                    step: step.clone(),
                    thread,
                },
            );
            return;
        }
        let outcome = run_execute(&rt, &l.model, l.handle, &p);
        self.judge_exec(at, step, &outcome, Some(&l.model));
    }

    /// `join`: waits for a background `execute` and judges it as if it had run in place.
    pub(super) fn join(&mut self, at: &str, step: &JoinStep) {
        let name = step.name.clone().unwrap_or_default();
        let Some(b) = self.background.remove(&name) else {
            self.rec.fail(
                at,
                format!("background step {name:?} exists"),
                "it does not",
            );
            return;
        };
        let outcome = b.thread.join().unwrap_or_else(|_| ExecOutcome {
            errors: vec!["the background thread panicked".into()],
            ..ExecOutcome::default()
        });
        let at = format!("{at} (step {} execute)", b.step_no);
        let m = b
            .step
            .model
            .as_ref()
            .and_then(|h| self.handles.get(h))
            .map(|l| l.model.clone());
        self.judge_exec(&at, &b.step, &outcome, m.as_deref());
    }
}

impl Runner<'_> {
    /// `tensor_op`: one write, read or copy on a TENSOR_OP queue, waited for; judged by its
    /// status (the schedule call's refusal, else the completion's), and on success by the
    /// bytes where they landed.
    pub(super) fn tensor_op(&mut self, at: &str, step: &crate::scenario::spec::TensorOpStep) {
        use crate::scenario::spec::TensorOpKind;
        let Some(rt) = self.runtime(at) else { return };
        let (bytes, vnc, queue) = (
            step.bytes.unwrap_or(4096),
            step.vnc.unwrap_or(0),
            step.queue.unwrap_or(0),
        );
        let t0 = Instant::now();
        let data: Vec<u8> = (0..bytes)
            .map(|i| (i.wrapping_mul(131) ^ self.sc.device.seed).to_le_bytes()[0])
            .collect();
        let tensor = |name: &str| rt.tensor_allocate(Placement::Device { vnc }, bytes, name);
        let lnc = i32::try_from(vnc).unwrap_or(i32::MAX);
        // The operation's result and, when it completed, where its bytes should now be.
        let run = || -> Result<Vec<u8>, runtime::NrtError> {
            let settled = |op: &ScheduledExecution| match rt.wait(op)? {
                NrtStatus::Success => Ok(()),
                s => Err(runtime::NrtError::new(
                    s,
                    format!("the tensor operation completed with {s}"),
                )),
            };
            let mut landed = vec![0u8; data.len()];
            match step.op.unwrap_or_default() {
                TensorOpKind::Write => {
                    let t = tensor("tensor_op_dst")?;
                    settled(&rt.tensor_write_schedule(&t, &data, 0, lnc, queue)?)?;
                    t.read(&mut landed, 0)?;
                }
                TensorOpKind::Read => {
                    let t = tensor("tensor_op_src")?;
                    t.write(&data, 0)?;
                    let dest = runtime::tensor_op::ReadBuffer::new(bytes)?;
                    settled(&rt.tensor_read_schedule(&dest, &t, 0, bytes, lnc, queue)?)?;
                    landed = dest.to_vec().unwrap_or_default();
                }
                TensorOpKind::Copy => {
                    let (src, dst) = (tensor("tensor_op_src")?, tensor("tensor_op_dst")?);
                    src.write(&data, 0)?;
                    settled(&rt.tensor_copy_schedule(&src, 0, &dst, 0, bytes, queue)?)?;
                    dst.read(&mut landed, 0)?;
                }
            }
            Ok(landed)
        };
        let r = run();
        let took = t0.elapsed().as_secs_f64();
        let landed = r.as_ref().ok().cloned();
        self.judge_call(at, step.call_expect(), &r.map(|_| ()), took);
        if let Some(landed) = landed {
            self.rec.record(
                landed == data,
                at,
                format!("the {bytes} bytes arrived"),
                match landed.iter().zip(&data).position(|(a, b)| a != b) {
                    None if landed.len() == data.len() => "they did".to_string(),
                    None => format!("{} bytes arrived", landed.len()),
                    Some(i) => format!("byte {i} differs"),
                },
            );
        }
    }
}
