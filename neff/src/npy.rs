//! The `.npy` format of `file` constants (numpy's format, versions 1.0, 2.0 and 3.0): the magic
//! `\x93NUMPY`, a version, a header length, a Python dict literal with `descr`,
//! `fortran_order` and `shape`, then the C-order array bytes.

use shared::model::DType;

/// A parsed `.npy` array.
#[derive(Debug, PartialEq, Eq)]
pub struct Npy<'a> {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u64>,
    /// The array bytes (exactly elements × width).
    pub data: &'a [u8],
}

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Parses a `.npy` file; the error is what is wrong (the caller names the member).
pub fn parse(bytes: &[u8]) -> Result<Npy<'_>, String> {
    if bytes.get(..6) != Some(&MAGIC[..]) {
        return Err("no \\x93NUMPY magic".into());
    }
    let major = *bytes.get(6).ok_or("truncated before the version")?;
    let (len, start) = match major {
        1 => {
            let b = bytes.get(8..10).ok_or("truncated header length")?;
            (usize::from(u16::from_le_bytes([b[0], b[1]])), 10usize)
        }
        2 | 3 => {
            let b = bytes.get(8..12).ok_or("truncated header length")?;
            let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            (
                usize::try_from(len).map_err(|_| "header length too large")?,
                12,
            )
        }
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let header = start
        .checked_add(len)
        .and_then(|end| bytes.get(start..end))
        .ok_or_else(|| format!("header of {len} bytes runs past the end"))?;
    let header = std::str::from_utf8(header).map_err(|_| "header is not text")?;
    let descr = dict_value(header, "descr").ok_or("header has no 'descr'")?;
    let descr = descr
        .strip_prefix('\'')
        .and_then(|d| d.split('\'').next())
        .ok_or_else(|| format!("'descr' {descr} is not a string"))?;
    let dtype = dtype_of(descr).ok_or_else(|| format!("dtype {descr:?} is not supported"))?;
    let fortran = dict_value(header, "fortran_order").ok_or("header has no 'fortran_order'")?;
    if fortran.starts_with("True") {
        return Err("fortran_order True is not supported".into());
    } else if !fortran.starts_with("False") {
        return Err("'fortran_order' is not a bool".into());
    }
    let shape = dict_value(header, "shape").ok_or("header has no 'shape'")?;
    let shape = parse_shape(shape)?;
    let data = &bytes[start + len..];
    let want = shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
        .ok_or("shape × width overflows")?;
    if data.len() as u64 != want {
        return Err(format!(
            "data is {} bytes but shape {shape:?} of {} needs {want}",
            data.len(),
            dtype.neff_name()
        ));
    }
    Ok(Npy { dtype, shape, data })
}

/// The text after `'key':` (leading blanks removed).
fn dict_value<'h>(header: &'h str, key: &str) -> Option<&'h str> {
    let quoted = format!("'{key}':");
    let at = header.find(&quoted)? + quoted.len();
    Some(header[at..].trim_start())
}

/// `(128, 128, 1, 1), ...` → `[128, 128, 1, 1]`.
fn parse_shape(text: &str) -> Result<Vec<u64>, String> {
    let inner = text
        .strip_prefix('(')
        .and_then(|t| t.split(')').next())
        .ok_or("'shape' is not a tuple")?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            d.parse::<u64>()
                .map_err(|_| format!("shape dimension {d:?} is not a number"))
        })
        .collect()
}

/// The type of a little-endian (or byte-order-free) numpy `descr`.
fn dtype_of(descr: &str) -> Option<DType> {
    Some(match descr {
        "<f2" => DType::F16,
        "<f4" => DType::F32,
        "|i1" | "<i1" => DType::I8,
        "|u1" | "<u1" => DType::U8,
        "<i2" => DType::I16,
        "<u2" => DType::U16,
        "<i4" => DType::I32,
        "<u4" => DType::U32,
        "<i8" => DType::I64,
        "<u8" => DType::U64,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(version: u8, dict: &str, data: &[u8]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend([version, 0]);
        if version == 1 {
            out.extend(u16::try_from(dict.len()).unwrap().to_le_bytes());
        } else {
            out.extend(u32::try_from(dict.len()).unwrap().to_le_bytes());
        }
        out.extend(dict.as_bytes());
        out.extend(data);
        out
    }

    #[test]
    fn versions_1_2_3_parse() {
        let dict = "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 3), }\n";
        for v in 1..=3 {
            let bytes = npy(v, dict, &[0; 12]);
            let a = parse(&bytes).unwrap();
            assert_eq!(
                (a.dtype, a.shape.as_slice(), a.data.len()),
                (DType::F16, &[2, 3][..], 12)
            );
        }
    }

    #[test]
    fn scalar_and_one_dim_shapes() {
        let a = npy(
            1,
            "{'descr': '<f4', 'fortran_order': False, 'shape': (), }",
            &[0; 4],
        );
        assert_eq!(parse(&a).unwrap().shape, Vec::<u64>::new());
        let a = npy(
            1,
            "{'descr': '|u1', 'fortran_order': False, 'shape': (5,), }",
            &[0; 5],
        );
        assert_eq!(parse(&a).unwrap().shape, vec![5]);
    }

    #[test]
    fn refusals_name_the_problem() {
        let cases: [(Vec<u8>, &str); 7] = [
            (b"NUMPY".to_vec(), "magic"),
            (npy(4, "{}", &[]), "version 4"),
            (
                npy(
                    1,
                    "{'descr': '>f2', 'fortran_order': False, 'shape': (1,), }",
                    &[0; 2],
                ),
                "\">f2\"",
            ),
            (
                npy(
                    1,
                    "{'descr': '<f2', 'fortran_order': True, 'shape': (1,), }",
                    &[0; 2],
                ),
                "fortran_order",
            ),
            (
                npy(
                    1,
                    "{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }",
                    &[0; 2],
                ),
                "needs 6",
            ),
            (
                npy(
                    1,
                    "{'descr': '<f2', 'fortran_order': False, 'shape': (99999999999, 99999999999), }",
                    &[],
                ),
                "overflows",
            ),
            (
                npy(
                    1,
                    "{'descr': '<f2', 'fortran_order': False, 'shape': (x,), }",
                    &[],
                ),
                "\"x\"",
            ),
        ];
        for (bytes, needle) in cases {
            let e = parse(&bytes).unwrap_err();
            assert!(e.contains(needle), "{e:?} lacks {needle:?}");
        }
        let mut short = npy(
            1,
            "{'descr': '<f2', 'fortran_order': False, 'shape': (1,), }",
            &[0; 2],
        );
        short.truncate(20);
        assert!(parse(&short).unwrap_err().contains("past the end"));
    }
}
