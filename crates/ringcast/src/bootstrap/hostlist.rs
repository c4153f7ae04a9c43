//! Slurm hostlist expressions (`node[1-4,7],gpu03`, `rack[1-2]-n[001-004]`): enough of the
//! syntax to name the first host and count the hosts, without expanding the list.

/// Why a hostlist expression could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostlistError {
    /// The expression names no host at all (empty, or only commas).
    #[error("the hostlist is empty")]
    Empty,
    /// A `[` without its `]`, a `]` without its `[`, or a nested `[`.
    #[error("unbalanced brackets at byte {0}")]
    Brackets(usize),
    /// A bracket item that is not `N` or `N-M` with decimal `N <= M`.
    #[error("bad range `{0}` (want `N` or `N-M` with N <= M)")]
    Range(String),
}

/// The first host of a Slurm hostlist, with zero padding kept as written.
///
/// ```
/// use ringcast::bootstrap::first_host;
/// assert_eq!(first_host("node[1-4,7],gpu03").unwrap(), "node1");
/// assert_eq!(first_host("n[001-004]").unwrap(), "n001");
/// assert_eq!(first_host("rack[2-3]-n[09-12]").unwrap(), "rack2-n09");
/// ```
pub fn first_host(hostlist: &str) -> Result<String, HostlistError> {
    let parsed = parse(hostlist)?;
    let first = parsed.first().ok_or(HostlistError::Empty)?;
    let mut host = String::new();
    for piece in first.iter() {
        match piece {
            Piece::Text(t) => host.push_str(t),
            // `split` yields at least one item and empty items are errors: never empty.
            Piece::Ranges(r) => host.push_str(r.first().map_or("", |r| r.lo_text)),
        }
    }
    Ok(host)
}

/// How many hosts a Slurm hostlist names (duplicates counted), saturating at `u64::MAX`.
///
/// ```
/// use ringcast::bootstrap::host_count;
/// assert_eq!(host_count("node[1-4,7],gpu03").unwrap(), 6);
/// ```
pub fn host_count(hostlist: &str) -> Result<u64, HostlistError> {
    let mut total = 0u64;
    for element in parse(hostlist)? {
        let mut n = 1u64;
        for piece in element {
            if let Piece::Ranges(r) = piece {
                let width: u64 = r.iter().fold(0u64, |s, r| {
                    s.saturating_add((r.hi - r.lo).saturating_add(1))
                });
                n = n.saturating_mul(width);
            }
        }
        total = total.saturating_add(n);
    }
    Ok(total)
}

/// One `lo-hi` (or single `lo`) item inside brackets; `lo_text` keeps its padding.
struct Range<'a> {
    lo_text: &'a str,
    lo: u64,
    hi: u64,
}

enum Piece<'a> {
    Text(&'a str),
    Ranges(Vec<Range<'a>>),
}

/// Every element of the list, each split into pieces; an error anywhere fails the whole list.
fn parse(hostlist: &str) -> Result<Vec<Vec<Piece<'_>>>, HostlistError> {
    elements(hostlist)?.into_iter().map(pieces).collect()
}

/// Splits at top-level commas (commas inside brackets separate ranges), dropping empty
/// elements; checks that brackets balance and do not nest.
fn elements(hostlist: &str) -> Result<Vec<&str>, HostlistError> {
    let mut out = Vec::new();
    let mut depth = false;
    let mut start = 0;
    for (i, c) in hostlist.char_indices() {
        match c {
            '[' if depth => return Err(HostlistError::Brackets(i)),
            '[' => depth = true,
            ']' if !depth => return Err(HostlistError::Brackets(i)),
            ']' => depth = false,
            ',' if !depth => {
                out.push(hostlist[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth {
        return Err(HostlistError::Brackets(hostlist.len()));
    }
    out.push(hostlist[start..].trim());
    out.retain(|e| !e.is_empty());
    if out.is_empty() {
        return Err(HostlistError::Empty);
    }
    Ok(out)
}

/// Splits one element (brackets already checked) into text and bracketed range lists.
fn pieces(element: &str) -> Result<Vec<Piece<'_>>, HostlistError> {
    let mut out = Vec::new();
    let mut rest = element;
    while let Some(open) = rest.find('[') {
        if open > 0 {
            out.push(Piece::Text(&rest[..open]));
        }
        let after = &rest[open + 1..];
        let close = after.find(']').ok_or(HostlistError::Brackets(open))?;
        let ranges = after[..close]
            .split(',')
            .map(range)
            .collect::<Result<Vec<_>, _>>()?;
        out.push(Piece::Ranges(ranges));
        rest = &after[close + 1..];
    }
    if !rest.is_empty() {
        out.push(Piece::Text(rest));
    }
    Ok(out)
}

fn range(item: &str) -> Result<Range<'_>, HostlistError> {
    let bad = || HostlistError::Range(item.to_owned());
    let number = |s: &str| -> Result<u64, HostlistError> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse().map_err(|_| bad())
    };
    let (lo_text, hi_text) = item.split_once('-').unwrap_or((item, item));
    let (lo, hi) = (number(lo_text)?, number(hi_text)?);
    if lo > hi {
        return Err(bad());
    }
    Ok(Range { lo_text, lo, hi })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_hosts() {
        for (list, first) in [
            ("node1", "node1"),
            ("node[1-4,7],gpu03", "node1"),
            ("gpu03,node[1-4]", "gpu03"),
            ("n[001-004]", "n001"),
            ("n[7,001-004]", "n7"),
            ("n[0099-0100]", "n0099"),
            ("rack[2-3]-n[09-12]", "rack2-n09"),
            ("[3-4]x", "3x"),
            ("node[5]", "node5"),
            (" ,node-a.example.org", "node-a.example.org"),
            ("10.0.0.1", "10.0.0.1"),
        ] {
            assert_eq!(first_host(list).as_deref(), Ok(first), "{list}");
        }
    }

    #[test]
    fn counts() {
        assert_eq!(host_count("node1"), Ok(1));
        assert_eq!(host_count("node[1-4,7],gpu03"), Ok(6));
        assert_eq!(host_count("rack[1-2]-n[01-04]"), Ok(8));
        assert_eq!(host_count("n[0-18446744073709551615],m"), Ok(u64::MAX));
    }

    #[test]
    fn bad_lists() {
        assert_eq!(first_host(""), Err(HostlistError::Empty));
        assert_eq!(first_host(" , "), Err(HostlistError::Empty));
        assert_eq!(first_host("node[1-4"), Err(HostlistError::Brackets(8)));
        assert_eq!(first_host("node1-4]"), Err(HostlistError::Brackets(7)));
        assert_eq!(first_host("n[[1]]"), Err(HostlistError::Brackets(2)));
        for bad in [
            "n[4-1]", "n[a-b]", "n[]", "n[1,]", "n[-3]", "n[1-2-3]", "n[+1]",
        ] {
            assert!(
                matches!(first_host(bad), Err(HostlistError::Range(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            first_host("ok,n[99999999999999999999]"),
            Err(HostlistError::Range(_))
        ));
    }
}
