//! The layer builder: dense (weights + bias), activation and softmax stacks compiled to the
//! five engine programs of one NC (DESIGN §6).
//!
//! Layout (NKI's): activations live transposed in SBUF, features on partitions and the batch
//! on the free axis, so a dense layer is one `Matmul` with the weights `[in, out]` as the
//! stationary operand (`K = in` partitions, `M = out`) and the activations `[in × batch]` moving,
//! giving `[out × batch]` in PSUM, and the bias is a per-partition vector the `Activation`
//! adds. Inputs arrive and outputs leave in the user's row-major `[batch, features]` layout, in
//! blocks of `k = ⌈batch / 128⌉` consecutive rows: partition `p` holds rows `p·k .. p·k + k`
//! side by side, which are contiguous in the tensor, so one DMA descriptor per partition loads
//! (stores) them. DVE transposes between the two layouts one tile at a time: tile `t` is row
//! `t` of every partition's block (rows `p·k + t`), so the batch's columns in the transposed
//! layout are in tile order rather than row order. Every column is computed on its own (a
//! matmul output element is one chain over its column; activations and softmax are per
//! element or per row), so the order changes no bit, and the output transposes put each row
//! back into its partition's block.
//!
//! Engines and semaphores: SP loads the constants and the input rows (signal IN); DVE
//! transposes the input (XT); PE runs each layer's matmul (MM_l) once the previous layer's
//! activation is done (ACT_{l-1}); ACT applies bias and activation (ACT_l); DVE transposes the
//! last layer's output (and runs the softmax with ACT's exponential); SP stores the output rows.
//! Every semaphore has exactly one consumer, which subtracts what it waited for, so all are back
//! at zero when the execution ends.

use shared::isa::{
    ActFunc, AluOp, Instruction, Opcode, ReduceOp, SBUF_PARTITION_BYTES, ScalarMode, Tile,
    encode_program, end_program,
};
use shared::model::{BufferSpec, DType, IoDesc, IoRing, Model, Operand, TensorSpec, TpbProgram};

/// Most features a layer may have (the partition count).
pub const MAX_FEATURES: u32 = 128;
/// Largest batch the builder compiles.
pub const MAX_BATCH: u32 = 900;
/// Partitions a tile of rows spans at most.
const ROWS_PER_TILE: u32 = 128;
const DECREMENT: u32 = u32::MAX; // a signal of -1: the consumer resets what it waited for

/// One layer of a stack.
#[derive(Clone, Debug, PartialEq)]
pub enum Layer {
    /// `y = x · W + b` with `W` row-major `[in, out]`.
    Dense {
        /// `[in × out]` weights, row-major.
        weights: Vec<f32>,
        /// `[out]` bias.
        bias: Vec<f32>,
    },
    /// An elementwise activation of the previous dense layer's output.
    Activation(ActFunc),
    /// Softmax over the features (the last layer only).
    Softmax,
}

/// A stack that cannot be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot build model {model:?}: {why}")]
pub struct BuildError {
    /// The model's name.
    pub model: String,
    /// What is wrong.
    pub why: String,
}

/// A stack of layers over `input_features` inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct MlpBuilder {
    name: String,
    input_features: u32,
    layers: Vec<Layer>,
}

struct Stage {
    inputs: u32,
    outputs: u32,
    weights: Vec<f32>,
    bias: Vec<f32>,
    acts: Vec<ActFunc>,
}

struct Alloc(u32);

impl Alloc {
    fn take(&mut self, bytes: u32) -> u32 {
        let at = self.0;
        self.0 += bytes.next_multiple_of(4);
        at
    }
}

impl MlpBuilder {
    /// An empty stack over `input_features` inputs.
    pub fn new(name: &str, input_features: u32) -> Self {
        Self {
            name: name.into(),
            input_features,
            layers: Vec::new(),
        }
    }

    /// Adds a dense layer (`weights` row-major `[in, out]`, `bias` of `out`).
    pub fn dense(mut self, weights: Vec<f32>, bias: Vec<f32>) -> Self {
        self.layers.push(Layer::Dense { weights, bias });
        self
    }

    /// Adds an activation.
    pub fn activation(mut self, f: ActFunc) -> Self {
        self.layers.push(Layer::Activation(f));
        self
    }

    /// Adds a softmax (must be last).
    pub fn softmax(mut self) -> Self {
        self.layers.push(Layer::Softmax);
        self
    }

    /// The layers.
    pub fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// Output features.
    pub fn output_features(&self) -> u32 {
        self.layers
            .iter()
            .rev()
            .find_map(|l| match l {
                Layer::Dense { bias, .. } => u32::try_from(bias.len()).ok(),
                _ => None,
            })
            .unwrap_or(self.input_features)
    }

    fn err(&self, why: impl Into<String>) -> BuildError {
        BuildError {
            model: self.name.clone(),
            why: why.into(),
        }
    }

    fn stages(&self) -> Result<(Vec<Stage>, bool), BuildError> {
        let mut stages: Vec<Stage> = Vec::new();
        let mut softmax = false;
        let mut features = self.input_features;
        for (i, layer) in self.layers.iter().enumerate() {
            if softmax {
                return Err(self.err("softmax must be the last layer"));
            }
            match layer {
                Layer::Dense { weights, bias } => {
                    let outputs =
                        u32::try_from(bias.len()).map_err(|_| self.err("bias too long"))?;
                    if weights.len() != features as usize * outputs as usize {
                        return Err(self.err(format!(
                            "layer {i}: {} weights for [{features}, {outputs}]",
                            weights.len()
                        )));
                    }
                    if outputs == 0 || outputs > MAX_FEATURES {
                        return Err(
                            self.err(format!("layer {i}: {outputs} outputs (1..={MAX_FEATURES})"))
                        );
                    }
                    stages.push(Stage {
                        inputs: features,
                        outputs,
                        weights: weights.clone(),
                        bias: bias.clone(),
                        acts: Vec::new(),
                    });
                    features = outputs;
                }
                Layer::Activation(f) => match stages.last_mut() {
                    Some(s) => s.acts.push(*f),
                    None => return Err(self.err("an activation must follow a dense layer")),
                },
                Layer::Softmax => {
                    if stages.is_empty() {
                        return Err(self.err("softmax must follow a dense layer"));
                    }
                    softmax = true;
                }
            }
        }
        if stages.is_empty() {
            return Err(self.err("no dense layer"));
        }
        if self.input_features == 0 || self.input_features > MAX_FEATURES {
            return Err(self.err(format!(
                "{} input features (1..={MAX_FEATURES})",
                self.input_features
            )));
        }
        if stages.len() > 40 {
            return Err(self.err("more than 40 dense layers"));
        }
        Ok((stages, softmax))
    }

    /// Compiles the stack for `batch` rows: tensors `input` `[batch, in]` and `output`
    /// `[batch, out]`, fp32.
    ///
    /// # Errors
    /// [`BuildError`] for a malformed stack, features above 128, a batch outside
    /// `1..=MAX_BATCH`, or state that does not fit one NC's SBUF.
    pub fn build(&self, batch: u32) -> Result<Model, BuildError> {
        self.build_split(batch, 1)
    }

    /// Compiles the stack for `batch` rows split over `lnc` physical NCs (1 or 2, LNC=2): NC `i`
    /// takes a contiguous half of the rows (the first NC the larger half) and runs the whole
    /// stack on it; both read the same `input` tensor and write their rows of `output`.
    ///
    /// # Errors
    /// As [`MlpBuilder::build`]; an `lnc` other than 1 or 2; fewer rows than NCs.
    pub fn build_split(&self, batch: u32, lnc: u32) -> Result<Model, BuildError> {
        let (stages, softmax) = self.stages()?;
        if batch == 0 || batch > MAX_BATCH {
            return Err(self.err(format!("batch {batch} (1..={MAX_BATCH})")));
        }
        if !(1..=2).contains(&lnc) || batch < lnc {
            return Err(self.err(format!(
                "{batch} rows over {lnc} NCs (LNC must be 1 or 2, at least one row each)"
            )));
        }
        let first = batch.div_ceil(lnc);
        let splits: Vec<(u32, u32)> = if lnc == 1 {
            vec![(0, batch)]
        } else {
            vec![(0, first), (first, batch - first)]
        };
        let tpbs = splits
            .iter()
            .map(|&(row0, rows)| self.tpb_program(&stages, softmax, rows, row0))
            .collect::<Result<Vec<_>, _>>()?;
        let in0 = self.input_features;
        let out_last = stages.last().map_or(in0, |s| s.outputs);
        let tensor = |name: &str, features: u32| TensorSpec {
            name: name.into(),
            dtype: DType::F32,
            shape: vec![batch, features],
            size: u64::from(batch) * u64::from(features) * 4,
        };
        let mut flags = [0u32; 13];
        flags[0] = 0x4D4C_5001; // "MLP" sequencer configuration, version 1
        Ok(Model {
            name: self.name.clone(),
            inputs: vec![tensor("input", in0)],
            outputs: vec![tensor("output", out_last)],
            sg_count: lnc,
            exec_req_flags: flags,
            act_table_hash: *b"simdev activation tables v1.....",
            dve_table_hash: [0; 32],
            has_collectives: false,
            tpbs,
        })
    }

    /// One NC's program for `batch` rows starting at row `row0` of the I/O tensors.
    fn tpb_program(
        &self,
        stages: &[Stage],
        softmax: bool,
        batch: u32,
        row0: u32,
    ) -> Result<TpbProgram, BuildError> {
        let in0 = self.input_features;
        let out_last = stages.last().map_or(in0, |s| s.outputs);
        // Rows per partition (`k`, also the number of tiles), partitions used, the rows of
        // partition `p`, the partitions of tile `t` (those whose block has a row `t`) and the
        // first transposed column of tile `t`.
        let tiles = batch.div_ceil(ROWS_PER_TILE);
        let parts = batch.div_ceil(tiles);
        let block_rows = |p: u32| (batch - p * tiles).min(tiles);
        let rows = |t: u32| (batch - t).div_ceil(tiles);
        let col = |t: u32| (0..t).map(rows).sum::<u32>();

        // SBUF layout, bytes per partition.
        let mut a = Alloc(0);
        let xin = a.take(tiles * in0 * 4);
        let xt = a.take(batch * 4);
        // The constants: per stage, a partition's weights row then its bias, all stages side
        // by side, so one descriptor per partition loads every stage's constants.
        let consts_at = a.0;
        let (w, b): (Vec<u32>, Vec<u32>) = stages
            .iter()
            .map(|s| {
                let w = a.take(s.outputs * 4);
                (w, a.take(4))
            })
            .unzip();
        let consts_width = a.0 - consts_at;
        let h: Vec<u32> = stages.iter().map(|_| a.take(batch * 4)).collect();
        let out = a.take(tiles * out_last * 4);
        let (tmax, tsum) = (a.take(tiles * 4), a.take(tiles * 4));
        if a.0 > SBUF_PARTITION_BYTES {
            return Err(self.err(format!(
                "needs {} bytes of SBUF per partition, an NC has {SBUF_PARTITION_BYTES}",
                a.0
            )));
        }
        let psum = |l: usize| if l.is_multiple_of(2) { 0 } else { batch * 4 };

        // Semaphores.
        const S_IN: u8 = 0;
        const S_XT: u8 = 1;
        const S_OUT: u8 = 100;
        const S_SM1: u8 = 101;
        const S_SM2: u8 = 102;
        let s_mm = |l: usize| 2 + 2 * u8::try_from(l).unwrap_or(0);
        let s_act = |l: usize| 3 + 2 * u8::try_from(l).unwrap_or(0);
        let consume = |sem: u8| {
            Instruction::new(Opcode::Nop, &[])
                .wait(sem, 1)
                .signal(sem, DECREMENT)
        };
        let last = stages.len() - 1;

        // Constants: one buffer of a row per partition (stage by stage: the partition's weights
        // row, zeros past the stage's inputs, then its bias, 0 past its outputs), loaded with one
        // descriptor per partition.
        let const_partitions = stages
            .iter()
            .map(|s| s.inputs.max(s.outputs))
            .max()
            .unwrap_or(0);
        let mut bytes = Vec::new();
        for p in 0..const_partitions {
            for s in stages {
                let (k, n) = (p as usize, s.outputs as usize);
                if p < s.inputs {
                    bytes.extend(
                        s.weights[k * n..(k + 1) * n]
                            .iter()
                            .flat_map(|v| v.to_le_bytes()),
                    );
                } else {
                    bytes.extend(std::iter::repeat_n(0u8, n * 4));
                }
                let bias = if p < s.outputs { s.bias[k] } else { 0.0 };
                bytes.extend(bias.to_le_bytes());
            }
        }
        let buffers = vec![BufferSpec {
            name: "dense".into(),
            size: bytes.len() as u64,
            init: bytes,
        }];
        let consts: Vec<IoDesc> = (0..const_partitions)
            .map(|p| IoDesc {
                src: Operand::Buffer {
                    index: 0,
                    offset: u64::from(p * consts_width),
                },
                dst: Operand::Sbuf {
                    partition: p,
                    offset: u64::from(consts_at),
                },
                len: consts_width,
            })
            .collect();
        // Partition `p`'s block of rows, in and out: one descriptor each.
        let block_in = |p: u32| IoDesc {
            src: Operand::Tensor {
                name: "input".into(),
                offset: u64::from((row0 + p * tiles) * in0 * 4),
            },
            dst: Operand::Sbuf {
                partition: p,
                offset: u64::from(xin),
            },
            len: block_rows(p) * in0 * 4,
        };
        let block_out = |p: u32| IoDesc {
            src: Operand::Sbuf {
                partition: p,
                offset: u64::from(out),
            },
            dst: Operand::Tensor {
                name: "output".into(),
                offset: u64::from((row0 + p * tiles) * out_last * 4),
            },
            len: block_rows(p) * out_last * 4,
        };
        let ring = |engine, queue, descs: Vec<IoDesc>| {
            let n = u32::try_from(descs.len()).unwrap_or(u32::MAX);
            IoRing {
                engine,
                queue,
                ring_descs: shared::udma::ring_size_for(n * 2),
                descs,
            }
        };
        let n_consts = u32::try_from(consts.len()).unwrap_or(u32::MAX);
        let io_rings = vec![
            ring(2, 0, consts),
            ring(1, 0, (0..parts).map(block_in).collect()),
            ring(1, 1, (0..parts).map(block_out).collect()),
        ];

        // SP: load, then store.
        let sp = vec![
            Instruction::new(Opcode::DmaStart, &[2, 0, n_consts]),
            Instruction::new(Opcode::DmaStart, &[1, 0, parts]),
            Instruction::new(Opcode::DmaWait, &[2, 0]),
            Instruction::new(Opcode::DmaWait, &[1, 0]).signal(S_IN, 1),
            consume(S_OUT),
            Instruction::new(Opcode::DmaStart, &[1, 1, parts]),
            Instruction::new(Opcode::DmaWait, &[1, 1]),
            Instruction::new(Opcode::End, &[]),
        ];
        // DVE: transposes in and out, softmax arithmetic.
        let mut dve = vec![consume(S_IN)];
        for t in 0..tiles {
            let src = Tile::sbuf(0, rows(t), xin + t * in0 * 4, in0);
            let dst = Tile::sbuf(0, in0, xt + col(t) * 4, rows(t));
            dve.push(Instruction::with_tiles(Opcode::Transpose, &[dst, src], &[]));
        }
        dve.push(Instruction::new(Opcode::Nop, &[]).signal(S_XT, 1));
        dve.push(consume(s_act(last)));
        let out_tile = |t: u32| Tile::sbuf(0, rows(t), out + t * out_last * 4, out_last);
        for t in 0..tiles {
            let src = Tile::sbuf(0, out_last, h[last] + col(t) * 4, rows(t));
            dve.push(Instruction::with_tiles(
                Opcode::Transpose,
                &[out_tile(t), src],
                &[],
            ));
        }
        let mut act = Vec::new();
        if softmax {
            for t in 0..tiles {
                let m = Tile::sbuf(0, rows(t), tmax + t * 4, 1);
                dve.push(Instruction::with_tiles(
                    Opcode::Reduce,
                    &[m, out_tile(t)],
                    &[ReduceOp::Max as u32],
                ));
                dve.push(Instruction::with_tiles(
                    Opcode::TensorScalar,
                    &[out_tile(t), out_tile(t)],
                    &[
                        AluOp::Subtract as u32,
                        ScalarMode::PerPartition as u32,
                        tmax + t * 4,
                    ],
                ));
            }
            dve.push(Instruction::new(Opcode::Nop, &[]).signal(S_SM1, 1));
            dve.push(consume(S_SM2));
            for t in 0..tiles {
                let s = Tile::sbuf(0, rows(t), tsum + t * 4, 1);
                dve.push(Instruction::with_tiles(
                    Opcode::Reduce,
                    &[s, out_tile(t)],
                    &[ReduceOp::Sum as u32],
                ));
                dve.push(Instruction::with_tiles(
                    Opcode::TensorScalar,
                    &[out_tile(t), out_tile(t)],
                    &[
                        AluOp::Divide as u32,
                        ScalarMode::PerPartition as u32,
                        tsum + t * 4,
                    ],
                ));
            }
        }
        dve.push(Instruction::new(Opcode::Nop, &[]).signal(S_OUT, 1));
        dve.push(Instruction::new(Opcode::End, &[]));
        // PE and ACT: one matmul and one activation pass per dense layer.
        let mut pe = Vec::new();
        for (l, s) in stages.iter().enumerate() {
            let (moving_off, prev) = if l == 0 {
                (xt, S_XT)
            } else {
                (h[l - 1], s_act(l - 1))
            };
            pe.push(consume(prev));
            let dst = Tile::psum(0, s.outputs, psum(l), batch);
            let stat = Tile::sbuf(0, s.inputs, w[l], s.outputs);
            let mov = Tile::sbuf(0, s.inputs, moving_off, batch);
            pe.push(
                Instruction::with_tiles(Opcode::Matmul, &[dst, stat, mov], &[]).signal(s_mm(l), 1),
            );
            act.push(consume(s_mm(l)));
            let hl = Tile::sbuf(0, s.outputs, h[l], batch);
            let first = s.acts.first().copied().unwrap_or(ActFunc::Identity);
            let mut passes = vec![Instruction::with_tiles(
                Opcode::Activation,
                &[hl, Tile::psum(0, s.outputs, psum(l), batch)],
                &[
                    first as u32,
                    1.0f32.to_bits(),
                    ScalarMode::PerPartition as u32,
                    b[l],
                ],
            )];
            for f in s.acts.iter().skip(1) {
                passes.push(Instruction::with_tiles(
                    Opcode::Activation,
                    &[hl, hl],
                    &[*f as u32, 1.0f32.to_bits(), ScalarMode::None as u32, 0],
                ));
            }
            if let Some(last_pass) = passes.pop() {
                act.extend(passes);
                act.push(last_pass.signal(s_act(l), 1));
            }
        }
        pe.push(Instruction::new(Opcode::End, &[]));
        if softmax {
            act.push(consume(S_SM1));
            for t in 0..tiles {
                act.push(Instruction::with_tiles(
                    Opcode::Activation,
                    &[out_tile(t), out_tile(t)],
                    &[ActFunc::Exp as u32, 1.0f32.to_bits(), 0, 0],
                ));
            }
            act.push(Instruction::new(Opcode::Nop, &[]).signal(S_SM2, 1));
        }
        act.push(Instruction::new(Opcode::End, &[]));

        Ok(TpbProgram {
            blocks: [
                encode_program(&pe),
                encode_program(&act),
                end_program(),
                encode_program(&dve),
                encode_program(&sp),
            ],
            buffers,
            io_rings,
        })
    }

    /// The stack computed on the host in f32, row by row: the reference the device is checked
    /// against. `inputs` is row-major `[batch, in]`. Test-only (feature `test-support`).
    ///
    /// # Errors
    /// As [`MlpBuilder::build`], for a stack that does not build; inputs that are not whole
    /// rows.
    #[cfg(any(test, feature = "test-support"))]
    pub fn reference_forward(&self, inputs: &[f32]) -> Result<Vec<f32>, BuildError> {
        let (stages, softmax) = self.stages()?;
        if !inputs.len().is_multiple_of(self.input_features as usize) {
            return Err(self.err(format!(
                "{} input values are not whole rows of {} features",
                inputs.len(),
                self.input_features
            )));
        }
        let batch = inputs.len() / self.input_features as usize;
        let mut x = inputs.to_vec();
        let mut features = self.input_features as usize;
        for s in &stages {
            let (k, n) = (s.inputs as usize, s.outputs as usize);
            let mut y = vec![0f32; batch * n];
            for r in 0..batch {
                for j in 0..n {
                    let mut acc = 0f32;
                    for i in 0..k {
                        acc += x[r * k + i] * s.weights[i * n + j];
                    }
                    let mut v = acc + s.bias[j];
                    for f in &s.acts {
                        v = apply(*f, v);
                    }
                    y[r * n + j] = v;
                }
            }
            x = y;
            features = n;
        }
        if softmax {
            for row in x.chunks_mut(features) {
                let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for v in row.iter_mut() {
                    *v = (*v - m).exp();
                    sum += *v;
                }
                for v in row.iter_mut() {
                    *v /= sum;
                }
            }
        }
        Ok(x)
    }
}

/// An activation function on one value (the reference semantics of `shared::isa::ActFunc`).
/// Test-only (feature `test-support`).
#[cfg(any(test, feature = "test-support"))]
pub fn apply(f: ActFunc, x: f32) -> f32 {
    match f {
        ActFunc::Identity => x,
        // A NaN stays a NaN, as simdev's ReLU keeps it (`f32::max` would give 0).
        ActFunc::Relu if x.is_nan() => x,
        ActFunc::Relu => x.max(0.0),
        ActFunc::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        ActFunc::Tanh => x.tanh(),
        ActFunc::Exp => x.exp(),
        ActFunc::Gelu => {
            0.5 * x
                * (1.0 + ((2.0 / std::f32::consts::PI).sqrt() * (x + 0.044_715 * x * x * x)).tanh())
        }
        ActFunc::Silu => x / (1.0 + (-x).exp()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_references_relu_keeps_a_nan_and_partial_rows_are_refused() {
        assert!(apply(ActFunc::Relu, f32::NAN).is_nan());
        assert_eq!(apply(ActFunc::Relu, -1.0), 0.0);
        let m = MlpBuilder::new("nan", 2)
            .dense(vec![1.0, 0.0, 0.0, 1.0], vec![0.0, 0.0])
            .activation(ActFunc::Relu);
        // Row 0 holds a NaN (every output of it is one: NaN · 0 is a NaN); row 1 does not.
        let out = m.reference_forward(&[f32::NAN, 0.0, -3.0, 1.0]).unwrap();
        assert!(out[0].is_nan() && out[1].is_nan(), "{out:?}");
        assert_eq!(out[2..], [0.0, 1.0]);
        let e = m.reference_forward(&[1.0, 2.0, 3.0]).unwrap_err();
        assert!(
            e.why.contains("3 input values are not whole rows of 2"),
            "{e}"
        );
    }

    fn tiny() -> MlpBuilder {
        MlpBuilder::new("tiny", 3)
            .dense(vec![1.0; 6], vec![0.5, -0.5])
            .activation(ActFunc::Relu)
    }

    #[test]
    fn builds_a_valid_container_with_a_descriptor_per_partition_block_of_rows() {
        let m = tiny().build(300).unwrap();
        m.validate().unwrap();
        let rings = &m.tpbs[0].io_rings;
        // 300 rows: blocks of ⌈300 / 128⌉ = 3 rows, on 100 partitions.
        assert_eq!(
            rings[1].descs.len(),
            100,
            "one descriptor per partition's rows"
        );
        assert_eq!(rings[2].descs.len(), 100);
        for (p, (d_in, d_out)) in rings[1].descs.iter().zip(&rings[2].descs).enumerate() {
            let p = u32::try_from(p).unwrap();
            let row = u64::from(p * 3);
            assert_eq!(
                (d_in.src.clone(), d_in.len),
                (
                    Operand::Tensor {
                        name: "input".into(),
                        offset: row * 3 * 4
                    },
                    3 * 3 * 4
                ),
                "partition {p} loads its 3 consecutive input rows"
            );
            assert!(matches!(d_in.dst, Operand::Sbuf { partition, .. } if partition == p));
            assert_eq!(
                (d_out.dst.clone(), d_out.len),
                (
                    Operand::Tensor {
                        name: "output".into(),
                        offset: row * 2 * 4
                    },
                    3 * 2 * 4
                )
            );
            assert!(matches!(d_out.src, Operand::Sbuf { partition, .. } if partition == p));
        }
        // 900 rows: blocks of 8 on 113 partitions, the last one holding the 4 rows left.
        let m900 = tiny().build(900).unwrap();
        m900.validate().unwrap();
        let rings900 = &m900.tpbs[0].io_rings;
        assert_eq!(rings900[1].descs.len(), 113);
        assert_eq!(rings900[1].descs[112].len, 4 * 3 * 4);
        assert_eq!(rings900[2].descs[112].len, 4 * 2 * 4);
        assert_eq!(
            rings[0].descs.len(),
            3,
            "one descriptor per partition for every stage's weights row and bias"
        );
        assert_eq!(m.outputs[0].shape, vec![300, 2]);
    }

    #[test]
    fn malformed_stacks_are_refused() {
        assert!(
            MlpBuilder::new("x", 3)
                .activation(ActFunc::Relu)
                .build(1)
                .is_err()
        );
        assert!(
            MlpBuilder::new("x", 3)
                .dense(vec![1.0; 5], vec![0.0; 2])
                .build(1)
                .is_err()
        );
        assert!(
            tiny()
                .softmax()
                .dense(vec![1.0; 2], vec![0.0])
                .build(1)
                .is_err()
        );
        assert!(tiny().build(0).is_err());
        assert!(tiny().build(MAX_BATCH + 1).is_err());
        assert!(
            MlpBuilder::new("x", 129)
                .dense(vec![0.0; 129], vec![0.0])
                .build(1)
                .is_err()
        );
    }

    #[test]
    fn reference_forward_matches_hand_computation() {
        let y = tiny().reference_forward(&[1.0, 2.0, 3.0]).unwrap();
        assert_eq!(y, vec![6.5, 5.5]);
        let sm = tiny()
            .softmax()
            .reference_forward(&[0.0, 0.0, 0.0])
            .unwrap();
        assert!((sm[0] - 1.0 / (1.0 + (-0.5f32).exp())).abs() < 1e-6);
    }
}
