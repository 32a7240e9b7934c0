//! Base64 for the kubeconfig's `*-data` fields and the exec plugin's cluster info.

/// Decodes standard base64 (RFC 4648 alphabet), padding optional, whitespace ignored. Written
/// by hand to stay within the dependency budget. Errors name the offset, never the content.
pub(crate) fn base64_decode(input: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(input.len() / 4 * 3 + 2);
    let (mut acc, mut bits, mut data_chars, mut padding) = (0u32, 0u32, 0usize, 0usize);
    for (offset, c) in input.bytes().enumerate() {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => {
                padding += 1;
                continue;
            }
            b' ' | b'\t' | b'\r' | b'\n' => continue,
            _ => {
                return Err(format!(
                    "invalid base64: unexpected character at offset {offset}"
                ))
            }
        };
        if padding > 0 {
            return Err(format!(
                "invalid base64: data after padding at offset {offset}"
            ));
        }
        acc = (acc << 6) | u32::from(value);
        bits += 6;
        data_chars += 1;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    if data_chars % 4 == 1 || padding > 2 {
        return Err("invalid base64: truncated input".to_string());
    }
    Ok(out)
}

/// Standard base64 with padding (for certificate-authority-data handed to exec plugins).
pub(crate) fn base64_encode(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
