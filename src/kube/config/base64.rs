//! Base64 for the kubeconfig's `*-data` fields and the exec plugin's cluster info.

use base64::alphabet::STANDARD;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::{DecodeError, Engine};

/// Standard alphabet; padding is handled by [`base64_decode`], and stray low bits in the last
/// character are accepted, as Go's `encoding/base64` (client-go's decoder) accepts them.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(true),
);

/// Decodes standard base64, padding optional, whitespace ignored (a `*-data` field folded over
/// lines). Errors name the offset in `input`, never the content.
pub(crate) fn base64_decode(input: &str) -> Result<Vec<u8>, String> {
    let is_space = |b: &u8| matches!(b, b' ' | b'\t' | b'\r' | b'\n');
    let compact: Vec<u8> = input.bytes().filter(|b| !is_space(b)).collect();
    // The offset in `input` of the `i`th byte that is not whitespace.
    let offset = |i: usize| {
        let mut kept = input.bytes().enumerate().filter(|(_, b)| !is_space(b));
        kept.nth(i).map_or(input.len(), |(o, _)| o)
    };
    let data_len = compact
        .iter()
        .position(|b| *b == b'=')
        .unwrap_or(compact.len());
    let padding = &compact[data_len..];
    if let Some(i) = padding.iter().position(|b| *b != b'=') {
        return Err(format!(
            "invalid base64: data after padding at offset {}",
            offset(data_len + i)
        ));
    }
    if padding.len() > 2 {
        return Err("invalid base64: truncated input".to_string());
    }
    LENIENT.decode(&compact[..data_len]).map_err(|e| match e {
        DecodeError::InvalidByte(i, _) => {
            format!(
                "invalid base64: unexpected character at offset {}",
                offset(i)
            )
        }
        _ => "invalid base64: truncated input".to_string(),
    })
}

/// Standard base64 with padding (for certificate-authority-data handed to exec plugins).
pub(crate) fn base64_encode(input: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(input)
}
