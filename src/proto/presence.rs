//! proto2 `required`-field presence checks.
//!
//! prost decodes a message whose `required` field is absent as if the field
//! held its default (a `CommandFlow` without `messagePermits` becomes 0
//! permits). Pulsar's Java decoders reject such a message
//! (`UninitializedMessageException`), so every decoder in this crate for a
//! proto2 message with `required` fields first walks the raw wire format and
//! checks that each required tag occurs, recursing into the nested
//! messages it decodes, then lets prost decode.
//!
//! The walk never allocates from a length read off the wire: it only slices
//! the input, and a length running past the end is
//! [`PresenceError::Truncated`].

/// Which tags of one proto2 message are `required`, and which declared
/// message-typed fields must be checked recursively.
#[derive(Debug)]
pub struct RequiredSpec {
    /// The message name (for error messages).
    pub message: &'static str,
    /// `(tag, field name)` of every `required` field.
    pub required: &'static [(u32, &'static str)],
    /// `(tag, spec)` of every message-typed field decoded by the caller;
    /// each occurrence of the tag is checked against `spec` (a repeated
    /// field has one element per occurrence; a singular field occurring
    /// more than once is merged by protobuf, so its required tags may be
    /// spread across occurrences).
    pub nested: &'static [(u32, bool, &'static RequiredSpec)],
}

/// A presence-check failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PresenceError {
    /// A `required` field is absent.
    #[error("{message} is missing required field {field} (tag {tag})")]
    MissingRequired {
        /// The message (dotted path for nested ones, e.g. `CommandMessage.message_id`).
        message: String,
        /// The field name as in the `.proto`.
        field: &'static str,
        /// The field's tag.
        tag: u32,
    },
    /// The bytes end inside a field.
    #[error("{message}: truncated protobuf at byte {at}")]
    Truncated {
        /// The message being walked.
        message: String,
        /// Byte offset where the walk ran out of input.
        at: usize,
    },
    /// Messages nested deeper than [`MAX_DEPTH`].
    #[error("{message} nested deeper than {MAX_DEPTH} levels")]
    TooDeep {
        /// The message at the limit.
        message: &'static str,
    },
    /// A wire type this crate does not accept (groups 3/4, or 6/7), or tag 0.
    #[error("{message}: invalid wire type {wire_type} or tag {tag} at byte {at}")]
    InvalidKey {
        /// The message being walked.
        message: String,
        /// The wire type found.
        wire_type: u8,
        /// The tag found.
        tag: u64,
        /// Byte offset of the key.
        at: usize,
    },
}

fn read_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in 0..10 {
        let b = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(b & 0x7f) << (shift * 7);
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// One field occurrence: its tag and, for length-delimited fields, the bytes.
struct Field<'a> {
    tag: u32,
    delimited: Option<&'a [u8]>,
    /// The value of a varint field.
    varint: Option<u64>,
}

fn walk<'a>(
    message: &(impl std::fmt::Display + ?Sized),
    bytes: &'a [u8],
) -> Result<Vec<Field<'a>>, PresenceError> {
    let truncated = |at| PresenceError::Truncated {
        message: message.to_string(),
        at,
    };
    // Every field takes at least two bytes (key and value): sized once for
    // a small message instead of growing field by field.
    let mut fields = Vec::with_capacity((bytes.len() / 2).min(16));
    let mut at = 0usize;
    while at < bytes.len() {
        let key_at = at;
        let key = read_varint(bytes, &mut at).ok_or_else(|| truncated(key_at))?;
        // Every field consumes at least its key byte, so the walk ends.
        debug_assert!(
            at > key_at,
            "the presence walk did not advance at byte {key_at}"
        );
        let wire_type = (key & 7) as u8;
        let tag = key >> 3;
        if tag == 0 || tag > u64::from(u32::MAX >> 3) {
            return Err(PresenceError::InvalidKey {
                message: message.to_string(),
                wire_type,
                tag,
                at: key_at,
            });
        }
        let mut delimited = None;
        let mut varint = None;
        match wire_type {
            0 => {
                varint = Some(read_varint(bytes, &mut at).ok_or_else(|| truncated(at))?);
            }
            1 => {
                at = at
                    .checked_add(8)
                    .filter(|e| *e <= bytes.len())
                    .ok_or_else(|| truncated(at))?
            }
            5 => {
                at = at
                    .checked_add(4)
                    .filter(|e| *e <= bytes.len())
                    .ok_or_else(|| truncated(at))?
            }
            2 => {
                let len = read_varint(bytes, &mut at).ok_or_else(|| truncated(at))?;
                let end = usize::try_from(len)
                    .ok()
                    .and_then(|l| at.checked_add(l))
                    .filter(|e| *e <= bytes.len())
                    .ok_or_else(|| truncated(at))?;
                delimited = Some(&bytes[at..end]);
                at = end;
            }
            _ => {
                return Err(PresenceError::InvalidKey {
                    message: message.to_string(),
                    wire_type,
                    tag,
                    at: key_at,
                })
            }
        }
        fields.push(Field {
            tag: tag as u32,
            delimited,
            varint,
        });
    }
    Ok(fields)
}

/// Nesting limit of the walk, prost's decode recursion limit: a message
/// nested deeper is rejected instead of recursing without bound (e.g. a
/// chain of `first_chunk_message_id`).
pub const MAX_DEPTH: u32 = 100;

/// Where a nested message sits, for error messages only: rendered (as
/// `Outer.Inner…`, or `….Inner` below depth 4) when an error needs it, so a
/// well-formed message is checked without building a string per level.
enum Path<'p> {
    Root(&'p str),
    Child {
        parent: &'p Path<'p>,
        /// The depth of `parent`'s check.
        parent_depth: u32,
        message: &'static str,
    },
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Root(m) => f.write_str(m),
            Path::Child {
                parent,
                parent_depth,
                message,
            } => {
                if *parent_depth < 4 {
                    write!(f, "{parent}.{message}")
                } else {
                    write!(f, "….{message}")
                }
            }
        }
    }
}

fn check_parts(
    spec: &RequiredSpec,
    path: &Path<'_>,
    parts: &[&[u8]],
    depth: u32,
) -> Result<(), PresenceError> {
    if depth > MAX_DEPTH {
        return Err(PresenceError::TooDeep {
            message: spec.message,
        });
    }
    let mut walked = Vec::with_capacity(parts.len());
    for p in parts {
        walked.push(walk(path, p)?);
    }
    for (tag, field) in spec.required {
        if !walked.iter().flatten().any(|f| f.tag == *tag) {
            return Err(PresenceError::MissingRequired {
                message: path.to_string(),
                field,
                tag: *tag,
            });
        }
    }
    for (tag, repeated, nested) in spec.nested {
        let occurrences: Vec<&[u8]> = walked
            .iter()
            .flatten()
            .filter(|f| f.tag == *tag)
            .filter_map(|f| f.delimited)
            .collect();
        if occurrences.is_empty() {
            continue;
        }
        let child = Path::Child {
            parent: path,
            parent_depth: depth,
            message: nested.message,
        };
        if *repeated {
            for o in occurrences {
                check_parts(nested, &child, &[o], depth + 1)?;
            }
        } else {
            check_parts(nested, &child, &occurrences, depth + 1)?;
        }
    }
    Ok(())
}

/// Checks that every required field of `spec` (and of its nested specs)
/// occurs in `bytes`.
///
/// # Errors
/// [`PresenceError`]: the first missing required field, or a structural
/// defect (truncation, invalid key) found while walking.
pub fn check_required(spec: &RequiredSpec, bytes: &[u8]) -> Result<(), PresenceError> {
    check_parts(spec, &Path::Root(spec.message), &[bytes], 0)
}

/// The bytes of the first occurrence of length-delimited field `tag` in
/// `bytes` (a message named `message` in errors); `Ok(None)` when absent.
///
/// # Errors
/// [`PresenceError`] for a structural defect found while walking.
pub fn find_delimited<'a>(
    message: &str,
    bytes: &'a [u8],
    tag: u32,
) -> Result<Option<&'a [u8]>, PresenceError> {
    Ok(walk(message, bytes)?
        .into_iter()
        .find(|f| f.tag == tag && f.delimited.is_some())
        .and_then(|f| f.delimited))
}

/// The value of the first occurrence of varint field `tag` in `bytes`;
/// `Ok(None)` when absent.
///
/// # Errors
/// [`PresenceError`] for a structural defect found while walking.
pub fn find_varint(message: &str, bytes: &[u8], tag: u32) -> Result<Option<u64>, PresenceError> {
    Ok(walk(message, bytes)?
        .into_iter()
        .find(|f| f.tag == tag && f.varint.is_some())
        .and_then(|f| f.varint))
}

/// The first of `tags` that does not occur in `bytes` (any wire type);
/// `Ok(None)` when every one occurs. For messages known by tag only (the
/// broker's commands checked by number, see `crate::proto::command`).
///
/// # Errors
/// [`PresenceError`] for a structural defect found while walking.
pub fn first_missing_tag(
    message: &str,
    bytes: &[u8],
    tags: &[u32],
) -> Result<Option<u32>, PresenceError> {
    let fields = walk(message, bytes)?;
    Ok(tags
        .iter()
        .copied()
        .find(|t| !fields.iter().any(|f| f.tag == *t)))
}

#[cfg(all(test, not(any(loom, feature = "shuttle"))))]
mod tests {
    use super::*;

    static INNER: RequiredSpec = RequiredSpec {
        message: "Inner",
        required: &[(1, "a")],
        nested: &[],
    };
    static OUTER: RequiredSpec = RequiredSpec {
        message: "Outer",
        required: &[(1, "id"), (2, "inner")],
        nested: &[(2, false, &INNER), (3, true, &INNER)],
    };

    #[test]
    fn required_tags_are_checked_recursively() {
        // id=5, inner={a=1}
        assert_eq!(check_required(&OUTER, &[0x08, 5, 0x12, 2, 0x08, 1]), Ok(()));
        // explicit zero counts as present
        assert_eq!(check_required(&OUTER, &[0x08, 0, 0x12, 2, 0x08, 0]), Ok(()));
        // id absent
        assert!(matches!(
            check_required(&OUTER, &[0x12, 2, 0x08, 1]),
            Err(PresenceError::MissingRequired { field: "id", .. })
        ));
        // inner present but empty
        assert!(matches!(
            check_required(&OUTER, &[0x08, 5, 0x12, 0]),
            Err(PresenceError::MissingRequired { field: "a", .. })
        ));
        // repeated element 2 lacks a
        assert!(matches!(
            check_required(
                &OUTER,
                &[0x08, 5, 0x12, 2, 0x08, 1, 0x1a, 2, 0x08, 1, 0x1a, 0]
            ),
            Err(PresenceError::MissingRequired { field: "a", .. })
        ));
        // truncated length
        assert!(matches!(
            check_required(&OUTER, &[0x08, 5, 0x12, 9, 0x08]),
            Err(PresenceError::Truncated { .. })
        ));
        // a self-nesting chain deeper than the limit is rejected, not recursed
        static CHAIN: RequiredSpec = RequiredSpec {
            message: "Chain",
            required: &[],
            nested: &[(7, false, &CHAIN)],
        };
        // (a few hundred levels: the walk stops at the limit)
        let deep = wrap(7, &[], 300);
        assert!(matches!(
            check_required(&CHAIN, &deep),
            Err(PresenceError::TooDeep { .. })
        ));
        // group wire type
        assert!(matches!(
            check_required(&OUTER, &[0x0b]),
            Err(PresenceError::InvalidKey { .. })
        ));
    }

    /// id=5, inner={a=1}: every required field present.
    const VALID: [u8; 6] = [0x08, 5, 0x12, 2, 0x08, 1];

    fn with(extra: &[u8]) -> Vec<u8> {
        let mut v = VALID.to_vec();
        v.extend_from_slice(extra);
        v
    }

    /// Field numbers run from 1 to 2^29 - 1 (protobuf's limit): the largest
    /// is an unknown field like any other; 0 and 2^29 are invalid keys.
    #[test]
    fn field_numbers_are_valid_from_1_to_2_pow_29_minus_1() {
        // tag 536870911, varint: key 0xFFFFFFF8, then value 0
        let max = with(&[0xf8, 0xff, 0xff, 0xff, 0x0f, 0x00]);
        assert_eq!(check_required(&OUTER, &max), Ok(()));
        // tag 536870912: key 1 << 32
        let over = with(&[0x80, 0x80, 0x80, 0x80, 0x10, 0x00]);
        assert_eq!(
            check_required(&OUTER, &over),
            Err(PresenceError::InvalidKey {
                message: "Outer".into(),
                wire_type: 0,
                tag: 536_870_912,
                at: 6,
            })
        );
        assert_eq!(
            check_required(&OUTER, &with(&[0x00, 0x00])),
            Err(PresenceError::InvalidKey {
                message: "Outer".into(),
                wire_type: 0,
                tag: 0,
                at: 6,
            })
        );
    }

    /// Fixed-width fields (wire types 1 and 5: 8 and 4 bytes) are walked
    /// over, and one cut short is `Truncated` at its value.
    #[test]
    fn fixed64_and_fixed32_fields_are_walked() {
        // tag 4 fixed64, tag 5 fixed32
        let fixed = with(&[0x21, 1, 2, 3, 4, 5, 6, 7, 8, 0x2d, 1, 2, 3, 4]);
        assert_eq!(check_required(&OUTER, &fixed), Ok(()));
        for (extra, at) in [(&[0x21, 1, 2, 3][..], 7), (&[0x2d, 1, 2][..], 7)] {
            assert_eq!(
                check_required(&OUTER, &with(extra)),
                Err(PresenceError::Truncated {
                    message: "Outer".into(),
                    at,
                })
            );
        }
        // exactly 8 / 4 bytes to the end of the buffer is complete
        assert_eq!(check_required(&OUTER, &with(&[0x2d, 1, 2, 3, 4])), Ok(()));
    }

    /// A chain nested exactly `MAX_DEPTH` levels deep is checked; one level
    /// more is `TooDeep`.
    #[test]
    fn nesting_is_checked_to_max_depth_inclusive() {
        static CHAIN: RequiredSpec = RequiredSpec {
            message: "Chain",
            required: &[],
            nested: &[(7, false, &CHAIN)],
        };
        let nest = |levels: u32| wrap(7, &[], levels as usize);
        assert_eq!(check_required(&CHAIN, &nest(MAX_DEPTH)), Ok(()));
        assert_eq!(
            check_required(&CHAIN, &nest(MAX_DEPTH + 1)),
            Err(PresenceError::TooDeep { message: "Chain" })
        );
    }

    /// Length-delimited `tag` around `inner`, repeated `levels` times.
    fn wrap(tag: u8, inner: &[u8], levels: usize) -> Vec<u8> {
        let mut deep = inner.to_vec();
        for _ in 0..levels {
            let mut outer = vec![(tag << 3) | 2];
            let mut len = deep.len();
            while len >= 0x80 {
                outer.push((len as u8 & 0x7f) | 0x80);
                len >>= 7;
            }
            outer.push(len as u8);
            outer.extend_from_slice(&deep);
            deep = outer;
        }
        deep
    }

    /// A missing field is named by its message's path: the full dotted path
    /// for a message nested up to 4 levels deep (five names), deeper ones as
    /// `….` and the message's own name.
    #[test]
    fn a_missing_field_names_its_message_path() {
        static NODE: RequiredSpec = RequiredSpec {
            message: "Node",
            required: &[(1, "id")],
            nested: &[(2, false, &NODE)],
        };
        let missing_at = |depth: usize| {
            // every level has id=1 except the innermost
            let mut m: Vec<u8> = Vec::new();
            for _ in 0..depth {
                let mut outer = vec![0x08, 1];
                outer.extend_from_slice(&wrap(2, &m, 1));
                m = outer;
            }
            match check_required(&NODE, &m) {
                Err(PresenceError::MissingRequired {
                    message,
                    field: "id",
                    tag: 1,
                }) => message,
                other => panic!("depth {depth}: {other:?}"),
            }
        };
        assert_eq!(missing_at(0), "Node");
        assert_eq!(missing_at(3), "Node.Node.Node.Node");
        assert_eq!(missing_at(4), "Node.Node.Node.Node.Node");
        assert_eq!(missing_at(5), "….Node");
        assert_eq!(missing_at(7), "….Node");
    }

    /// Each element of a repeated self-nesting field is one level deeper:
    /// the depth limit holds through repeated fields too.
    #[test]
    fn repeated_nesting_counts_toward_max_depth() {
        static LIST: RequiredSpec = RequiredSpec {
            message: "List",
            required: &[],
            nested: &[(3, true, &LIST)],
        };
        let levels = MAX_DEPTH as usize;
        assert_eq!(check_required(&LIST, &wrap(3, &[], levels)), Ok(()));
        assert_eq!(
            check_required(&LIST, &wrap(3, &[], levels + 1)),
            Err(PresenceError::TooDeep { message: "List" })
        );
    }
}
