//! A header map read in one host call, and proxy-wasm's encoding of it.
//!
//! Each header read or removal is a crossing into the host (two when a value comes back:
//! the host allocates its copy inside the VM), and the request path asks for a dozen names
//! of which a request carries two or three. Reading the whole map once
//! (`proxy_get_header_map_pairs`) and looking names up here takes a routed request's
//! header callback from about twenty crossings to three or four (docs/performance.md,
//! "One read of the header map").
//!
//! The encoding (the ABI's, both ways): a little-endian `u32` count, then per pair the
//! `u32` lengths of name and value, then each name and value followed by a NUL.

/// The headers of one map as the host had them: names lower-case (Envoy's), in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderMap(Vec<(String, String)>);

impl HeaderMap {
    pub fn new(pairs: Vec<(String, String)>) -> HeaderMap {
        HeaderMap(pairs)
    }

    /// The first value of header `name` (lower case, as the configuration requires).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    pub fn pairs(&self) -> &[(String, String)] {
        &self.0
    }
}

/// `pairs` in proxy-wasm's header map encoding (a local reply's headers).
pub fn encode(pairs: &[(&str, &str)]) -> Vec<u8> {
    let size = 4 + pairs.iter().map(|(n, v)| 10 + n.len() + v.len()).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (name, value) in pairs {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    }
    for (name, value) in pairs {
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(value.as_bytes());
        out.push(0);
    }
    out
}

/// A map in proxy-wasm's encoding (lossy UTF-8); `None` when the bytes do not hold one
/// (the SDK's own decoder panics there, and a panic kills the VM). No bytes: an empty map.
pub fn decode(bytes: &[u8]) -> Option<HeaderMap> {
    if bytes.is_empty() {
        return Some(HeaderMap::default());
    }
    let u32_at = |at: usize| -> Option<usize> {
        let b = bytes.get(at..at.checked_add(4)?)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let count = u32_at(0)?;
    // Every pair takes at least 10 bytes: a count beyond that is not a map (and not an allocation).
    if count > bytes.len() / 10 {
        return None;
    }
    let mut text = 4 + count * 8;
    let mut take = |len: usize| -> Option<String> {
        let end = text.checked_add(len)?;
        let s = String::from_utf8_lossy(bytes.get(text..end)?).into_owned();
        (bytes.get(end) == Some(&0)).then_some(())?;
        text = end + 1;
        Some(s)
    };
    let mut pairs = Vec::with_capacity(count);
    for i in 0..count {
        let (name_len, value_len) = (u32_at(4 + i * 8)?, u32_at(8 + i * 8)?);
        pairs.push((take(name_len)?, take(value_len)?));
    }
    Some(HeaderMap(pairs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_map_comes_back_as_it_was_encoded() {
        let pairs = [(":method", "POST"), (":path", "/v1/completions"), ("x-slo-ttft-ms", ""), ("x-a", "1")];
        let map = decode(&encode(&pairs)).unwrap();
        let back: Vec<(&str, &str)> = map.pairs().iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        assert_eq!(back, pairs);
        assert_eq!(map.get(":path"), Some("/v1/completions"));
        assert_eq!(map.get("x-slo-ttft-ms"), Some(""), "present but empty is present");
        assert!(map.contains("x-a") && !map.contains("x-b"));
        assert_eq!(decode(&[]), Some(HeaderMap::default()));
        assert_eq!(decode(&encode(&[])), Some(HeaderMap::default()));
    }

    #[test]
    fn the_first_of_repeated_headers_is_the_value() {
        let map = decode(&encode(&[("x-a", "1"), ("x-a", "2")])).unwrap();
        assert_eq!(map.get("x-a"), Some("1"));
    }

    #[test]
    fn bytes_that_are_not_a_map_are_refused_not_a_panic() {
        let good = encode(&[("name", "value"), ("other", "x")]);
        for cut in 1..good.len() {
            assert_eq!(decode(&good[..cut]), None, "cut at {cut}");
        }
        let mut no_nul = good.clone();
        let last = no_nul.len() - 1;
        no_nul[last] = b'!';
        assert_eq!(decode(&no_nul), None);
        assert_eq!(decode(&u32::MAX.to_le_bytes()), None, "a huge count allocates nothing");
        let mut huge_len = good.clone();
        huge_len[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode(&huge_len), None);
    }

    #[test]
    fn a_value_that_is_not_utf8_is_read_lossily() {
        let mut bytes = encode(&[("x-a", "ab")]);
        let at = bytes.len() - 3;
        bytes[at] = 0xff;
        assert_eq!(decode(&bytes).unwrap().get("x-a"), Some("\u{fffd}b"));
    }
}
