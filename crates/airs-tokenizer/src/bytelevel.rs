//! GPT-2's byte ↔ Unicode table (`bytes_to_unicode` in OpenAI's encoder.py).
//!
//! Byte-level BPE vocabularies never contain raw bytes: each byte is written as one printable
//! character. The 188 printable Latin-1 bytes (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`) stand for
//! themselves; the other 68 (controls, space, DEL, NBSP, soft hyphen) are mapped in order to
//! U+0100..=U+0143, so the space byte is `Ġ` (U+0120) and newline is `Ċ` (U+010A).

/// Whether byte `b` is written as the character with the same code point.
const fn is_direct(b: u32) -> bool {
    (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
}

const fn build_byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next_indirect = 0u32;
    let mut b = 0u32;
    while b < 256 {
        let cp = if is_direct(b) {
            b
        } else {
            next_indirect += 1;
            255 + next_indirect
        };
        table[b as usize] = match char::from_u32(cp) {
            Some(c) => c,
            None => '\0',
        };
        b += 1;
    }
    table
}

const fn build_indirect_bytes() -> [u8; 68] {
    let mut table = [0u8; 68];
    let mut n = 0;
    let mut b = 0u32;
    while b < 256 {
        if !is_direct(b) {
            table[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    table
}

/// The character that stands for each byte.
pub(crate) static BYTE_TO_CHAR: [char; 256] = build_byte_to_char();

/// The bytes written as U+0100 + i, in order.
static INDIRECT_BYTES: [u8; 68] = build_indirect_bytes();

/// The byte a byte-level character stands for, if it is one of the 256.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 256 && is_direct(cp) {
        Some(cp as u8)
    } else if (256..256 + 68).contains(&cp) {
        Some(INDIRECT_BYTES[(cp - 256) as usize])
    } else {
        None
    }
}

/// Append the byte-level encoding of `bytes` to `out`.
pub(crate) fn encode_into(bytes: &[u8], out: &mut String) {
    out.extend(bytes.iter().map(|&b| BYTE_TO_CHAR[b as usize]));
}

/// Append the bytes a byte-level string stands for to `out`. Characters outside the table
/// (which a well-formed vocabulary never has) are copied as their own UTF-8.
pub(crate) fn decode_into(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_a_bijection_with_the_known_landmarks() {
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_TO_CHAR[b'a' as usize], 'a');
        assert_eq!(BYTE_TO_CHAR[0], '\u{100}');
        assert_eq!(BYTE_TO_CHAR[0xAD], '\u{143}');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(BYTE_TO_CHAR[b as usize]), Some(b));
        }
        assert_eq!(char_to_byte('\u{144}'), None);
        assert_eq!(char_to_byte(' '), None);
    }
}
