//! The block RPC over a kernel TCP stream: each request and answer is
//! one message, framed by its length (4 bytes, big-endian) since a stream
//! keeps no boundaries of its own.

use std::io::{Read, Write};

use super::MESSAGE;

/// Writes one message made of `parts`.
pub fn send(stream: &mut impl Write, parts: &[&[u8]]) -> std::io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    stream.write_all(&(len as u32).to_be_bytes())?;
    for part in parts {
        stream.write_all(part)?;
    }
    Ok(())
}

/// Reads one message into `buffer`; its length. A message longer than a
/// whole block is refused: no peer of ours sends one.
pub fn receive(stream: &mut impl Read, buffer: &mut [u8; MESSAGE]) -> std::io::Result<usize> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MESSAGE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a message of {len} bytes, more than a block's {MESSAGE}"),
        ));
    }
    stream.read_exact(&mut buffer[..len])?;
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_keep_their_bounds_on_a_stream() {
        let mut stream = Vec::new();
        send(&mut stream, &[b"head", b"er"]).unwrap();
        send(&mut stream, &[b"ack"]).unwrap();
        assert_eq!(&stream[..4], &[0, 0, 0, 6]);
        let (mut reader, mut buffer) = (&stream[..], [0u8; MESSAGE]);
        assert_eq!(receive(&mut reader, &mut buffer).unwrap(), 6);
        assert_eq!(&buffer[..6], b"header");
        assert_eq!(receive(&mut reader, &mut buffer).unwrap(), 3);
        assert_eq!(&buffer[..3], b"ack");
        let too_long = (MESSAGE as u32 + 1).to_be_bytes();
        assert!(receive(&mut &too_long[..], &mut buffer).is_err());
    }
}
