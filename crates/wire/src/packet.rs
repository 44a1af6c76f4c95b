//! A whole RoCEv2 packet as carried in a UDP datagram:
//! `BTH | extension headers | payload | pad | ICRC`.
//!
//! [`PacketRepr::parse`] checks that the extension headers the opcode calls
//! for are all there and that the pad count agrees with the length; it does
//! not check the ICRC, which needs the IP and UDP headers ([`crate::icrc`]).

use crate::{Error, Opcode, Result, aeth, atomic_ack_eth, atomic_eth, bth, deth, ieth, immdt, reth, sack, sreth};

/// Length of the invariant CRC trailer.
pub const ICRC_LEN: usize = 4;

/// The extension headers of one packet. Which of them are present is fixed
/// by the opcode ([`crate::Opcode::layout`]), and for softrnic's
/// selective-repeat headers by the BTH's transport version as well
/// ([`SelectiveRepeatLayout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Extensions {
    pub deth: Option<deth::Repr>,
    pub reth: Option<reth::Repr>,
    pub atomic_eth: Option<atomic_eth::Repr>,
    pub aeth: Option<aeth::Repr>,
    /// AtomicAckETH: the remote value before the atomic operation.
    pub atomic_ack: Option<u64>,
    /// ImmDt.
    pub immediate: Option<u32>,
    /// IETH: the R_Key to invalidate.
    pub invalidate_rkey: Option<u32>,
    /// softrnic's SRETH: where a selective-repeat SEND or WRITE packet
    /// belongs in its message.
    pub sreth: Option<sreth::Repr>,
    /// softrnic's SACK ETH: what a selective NAK's responder holds beyond
    /// the gap.
    pub sack: Option<sack::Repr>,
}

/// Which of softrnic's selective-repeat headers a packet carries: with
/// transport version 1, an SRETH after the standard headers of an RC SEND
/// or WRITE, a SACK ETH after the AETH of an RC ACK. Both come last, just
/// before the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelectiveRepeatLayout {
    pub sreth: bool,
    pub sack: bool,
}

impl SelectiveRepeatLayout {
    /// The layout a BTH implies; an error for transport version 1 on an
    /// opcode that has no selective-repeat form.
    pub fn of(bth: &bth::Repr) -> Result<SelectiveRepeatLayout> {
        let op = bth.opcode;
        let sreth = (op.is_send() || op.is_write()) && !op.is_ud();
        let sack = op == Opcode::RcAck;
        match bth.selective_repeat {
            false => Ok(SelectiveRepeatLayout { sreth: false, sack: false }),
            true if sreth || sack => Ok(SelectiveRepeatLayout { sreth, sack }),
            true => Err(Error::UnsupportedVersion(1)),
        }
    }

    /// Bytes these headers add.
    pub fn header_len(&self) -> usize {
        let sreth = if self.sreth { sreth::Header::<&[u8]>::LEN } else { 0 };
        let sack = if self.sack { sack::Header::<&[u8]>::LEN } else { 0 };
        sreth + sack
    }
}

/// The BTH and extension headers of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headers {
    /// `bth.pad_count` is ignored on emit: it follows from the payload.
    pub bth: bth::Repr,
    pub ext: Extensions,
}

/// A parsed packet borrowing its payload from the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketRepr<'a> {
    pub headers: Headers,
    pub payload: &'a [u8],
}

/// Bytes of padding that align a payload of `len` bytes to 4.
pub const fn pad_for(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// Length of the whole datagram for headers of `header_len` bytes and a
/// payload of `payload_len` bytes.
pub const fn packet_len(header_len: usize, payload_len: usize) -> usize {
    header_len + payload_len + pad_for(payload_len) + ICRC_LEN
}

impl Headers {
    /// Bytes from the start of the BTH to the payload.
    pub fn len(&self) -> usize {
        let selective = SelectiveRepeatLayout::of(&self.bth).map_or(0, |l| l.header_len());
        bth::Header::<&[u8]>::LEN + self.bth.opcode.extension_len() + selective
    }

    /// Always false: a packet has at least a BTH. Present for symmetry with
    /// [`Headers::len`].
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Checks that exactly the extension headers the opcode needs are set.
    fn check_layout(&self) -> Result<()> {
        let l = self.bth.opcode.layout();
        let e = &self.ext;
        let agree = l.deth == e.deth.is_some()
            && l.reth == e.reth.is_some()
            && l.atomic_eth == e.atomic_eth.is_some()
            && l.aeth == e.aeth.is_some()
            && l.atomic_ack_eth == e.atomic_ack.is_some()
            && l.immdt == e.immediate.is_some()
            && l.ieth == e.invalidate_rkey.is_some();
        let s = SelectiveRepeatLayout::of(&self.bth)?;
        let agree = agree && s.sreth == e.sreth.is_some() && s.sack == e.sack.is_some();
        if agree { Ok(()) } else { Err(Error::Reserved) }
    }

    /// Writes the headers for a payload of `payload_len` bytes at the start
    /// of `buf`, then the pad and a zeroed ICRC after the payload, which the
    /// caller has written (or will write) at `buf[self.len()..]`. Returns
    /// the length of the whole packet.
    ///
    /// Writing the payload in place lets the transport copy it straight
    /// from registered memory into the datagram.
    pub fn emit_around_payload(&self, buf: &mut [u8], payload_len: usize) -> Result<usize> {
        self.check_layout()?;
        if payload_len > 0 && !self.bth.opcode.layout().payload {
            return Err(Error::Reserved);
        }
        let header_len = self.len();
        let total = packet_len(header_len, payload_len);
        if buf.len() < total {
            return Err(Error::Truncated);
        }
        let pad = pad_for(payload_len);
        let mut bth = self.bth;
        bth.pad_count = pad as u8;
        bth.emit(&mut bth::Header::new_unchecked(&mut buf[..]));

        let mut at = bth::Header::<&[u8]>::LEN;
        let e = &self.ext;
        if let Some(r) = e.deth {
            r.emit(&mut deth::Header::new_unchecked(&mut buf[at..]));
            at += deth::Header::<&[u8]>::LEN;
        }
        if let Some(r) = e.reth {
            r.emit(&mut reth::Header::new_unchecked(&mut buf[at..]));
            at += reth::Header::<&[u8]>::LEN;
        }
        if let Some(r) = e.atomic_eth {
            r.emit(&mut atomic_eth::Header::new_unchecked(&mut buf[at..]));
            at += atomic_eth::Header::<&[u8]>::LEN;
        }
        if let Some(r) = e.aeth {
            r.emit(&mut aeth::Header::new_unchecked(&mut buf[at..]));
            at += aeth::Header::<&[u8]>::LEN;
        }
        if let Some(v) = e.atomic_ack {
            atomic_ack_eth::Header::new_unchecked(&mut buf[at..]).set_original(v);
            at += atomic_ack_eth::Header::<&[u8]>::LEN;
        }
        if let Some(v) = e.immediate {
            immdt::Header::new_unchecked(&mut buf[at..]).set_immediate(v);
            at += immdt::Header::<&[u8]>::LEN;
        }
        if let Some(v) = e.invalidate_rkey {
            ieth::Header::new_unchecked(&mut buf[at..]).set_rkey(v);
            at += ieth::Header::<&[u8]>::LEN;
        }
        if let Some(r) = e.sreth {
            r.emit(&mut sreth::Header::new_unchecked(&mut buf[at..]));
            at += sreth::Header::<&[u8]>::LEN;
        }
        if let Some(r) = e.sack {
            r.emit(&mut sack::Header::new_unchecked(&mut buf[at..]));
            at += sack::Header::<&[u8]>::LEN;
        }
        // Reserved bytes (a CNP's 16), the pad and the ICRC placeholder are zero.
        buf[at..header_len].fill(0);
        buf[header_len + payload_len..total].fill(0);
        Ok(total)
    }

    /// Writes headers, `payload`, pad and a zeroed ICRC into `buf`.
    pub fn emit_packet(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize> {
        let start = self.len();
        let end = start.checked_add(payload.len()).ok_or(Error::Truncated)?;
        buf.get_mut(start..end).ok_or(Error::Truncated)?.copy_from_slice(payload);
        self.emit_around_payload(buf, payload.len())
    }
}

impl<'a> PacketRepr<'a> {
    /// Parses a datagram (BTH to ICRC inclusive).
    pub fn parse(datagram: &'a [u8]) -> Result<PacketRepr<'a>> {
        let bth = bth::Repr::parse(&bth::Header::new_checked(datagram)?)?;
        let layout = bth.opcode.layout();
        let selective = SelectiveRepeatLayout::of(&bth)?;
        let header_len = bth::Header::<&[u8]>::LEN + bth.opcode.extension_len() + selective.header_len();
        let body_len = datagram.len().checked_sub(header_len + ICRC_LEN).ok_or(Error::Truncated)?;
        let pad = usize::from(bth.pad_count);
        if body_len % 4 != 0 || pad > body_len || (!layout.payload && body_len != 0) {
            return Err(Error::BadPadding);
        }

        let mut ext = Extensions::default();
        let mut at = bth::Header::<&[u8]>::LEN;
        if layout.deth {
            ext.deth = Some(deth::Repr::parse(&deth::Header::new_checked(&datagram[at..])?)?);
            at += deth::Header::<&[u8]>::LEN;
        }
        if layout.reth {
            ext.reth = Some(reth::Repr::parse(&reth::Header::new_checked(&datagram[at..])?)?);
            at += reth::Header::<&[u8]>::LEN;
        }
        if layout.atomic_eth {
            let h = atomic_eth::Header::new_checked(&datagram[at..])?;
            ext.atomic_eth = Some(atomic_eth::Repr::parse(&h)?);
            at += atomic_eth::Header::<&[u8]>::LEN;
        }
        if layout.aeth {
            ext.aeth = Some(aeth::Repr::parse(&aeth::Header::new_checked(&datagram[at..])?)?);
            at += aeth::Header::<&[u8]>::LEN;
        }
        if layout.atomic_ack_eth {
            let h = atomic_ack_eth::Header::new_checked(&datagram[at..])?;
            ext.atomic_ack = Some(atomic_ack_eth::parse(&h)?);
            at += atomic_ack_eth::Header::<&[u8]>::LEN;
        }
        if layout.immdt {
            ext.immediate = Some(immdt::parse(&immdt::Header::new_checked(&datagram[at..])?)?);
            at += immdt::Header::<&[u8]>::LEN;
        }
        if layout.ieth {
            ext.invalidate_rkey = Some(ieth::parse(&ieth::Header::new_checked(&datagram[at..])?)?);
            at += ieth::Header::<&[u8]>::LEN;
        }
        // A CNP's reserved bytes come last among the opcode's headers.
        at += layout.reserved;
        if selective.sreth {
            ext.sreth = Some(sreth::Repr::parse(&sreth::Header::new_checked(&datagram[at..])?)?);
            at += sreth::Header::<&[u8]>::LEN;
        }
        if selective.sack {
            ext.sack = Some(sack::Repr::parse(&sack::Header::new_checked(&datagram[at..])?)?);
        }

        let payload = &datagram[header_len..header_len + body_len - pad];
        Ok(PacketRepr { headers: Headers { bth, ext }, payload })
    }

    /// Writes the packet into `buf`, returning its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        self.headers.emit_packet(buf, self.payload)
    }

    /// Length of the datagram this packet emits to.
    pub fn buffer_len(&self) -> usize {
        packet_len(self.headers.len(), self.payload.len())
    }
}

/// One line about a datagram, for traces: opcode, QP, PSN, AckReq, AETH
/// syndrome and payload length.
pub fn summary(datagram: &[u8]) -> String {
    match PacketRepr::parse(datagram) {
        Ok(p) => {
            let bth = p.headers.bth;
            let aeth = p.headers.ext.aeth.map(|a| format!(" {:?}", a.syndrome)).unwrap_or_default();
            format!(
                "qp {:#x} {:?} psn {}{}{} len {}",
                bth.dest_qpn,
                bth.opcode,
                bth.psn,
                if bth.ack_request { " A" } else { "" },
                aeth,
                p.payload.len()
            )
        }
        Err(e) => format!("unparsable ({e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Opcode, Psn};

    fn bth(opcode: Opcode) -> bth::Repr {
        bth::Repr { ack_request: true, ..bth::Repr::new(opcode, 0x12, Psn::new(7)) }
    }

    #[test]
    fn write_only_with_immediate_literal_bytes() {
        let headers = Headers {
            bth: bth(Opcode::RcWriteOnlyImm),
            ext: Extensions {
                reth: Some(reth::Repr { virtual_address: 0x1000, rkey: 0x55, dma_length: 3 }),
                immediate: Some(0xcafe_f00d),
                ..Extensions::default()
            },
        };
        let mut buf = [0u8; 64];
        let len = headers.emit_packet(&mut buf, b"abc").unwrap();
        #[rustfmt::skip]
        let expected: &[u8] = &[
            0x0b, 0x10, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x80, 0x00, 0x00, 0x07, // BTH, pad 1
            0, 0, 0, 0, 0, 0, 0x10, 0x00, 0, 0, 0, 0x55, 0, 0, 0, 3,                 // RETH
            0xca, 0xfe, 0xf0, 0x0d,                                                  // ImmDt
            b'a', b'b', b'c', 0,                                                     // payload, pad
            0, 0, 0, 0,                                                              // ICRC slot
        ];
        assert_eq!(&buf[..len], expected);
        let parsed = PacketRepr::parse(expected).unwrap();
        assert_eq!(parsed.payload, b"abc");
        assert_eq!(parsed.headers.ext, headers.ext);
        assert_eq!(parsed.headers.bth.pad_count, 1);
    }

    #[test]
    fn atomic_ack_literal_bytes() {
        let headers = Headers {
            bth: bth(Opcode::RcAtomicAck),
            ext: Extensions {
                aeth: Some(aeth::Repr { syndrome: aeth::Syndrome::Ack { credit_code: 0x1f }, msn: 9 }),
                atomic_ack: Some(0x0102_0304_0506_0708),
                ..Extensions::default()
            },
        };
        let mut buf = [0u8; 40];
        let len = headers.emit_packet(&mut buf, &[]).unwrap();
        assert_eq!(len, 12 + 4 + 8 + 4);
        assert_eq!(&buf[12..24], &[0x1f, 0, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(PacketRepr::parse(&buf[..len]).unwrap().headers.ext, headers.ext);
    }

    #[test]
    fn rejects_missing_or_extra_headers_on_emit() {
        let headers = Headers { bth: bth(Opcode::RcWriteOnly), ext: Extensions::default() };
        assert_eq!(headers.emit_packet(&mut [0u8; 64], b"x"), Err(Error::Reserved));
        let ack = Headers { bth: bth(Opcode::RcAck), ext: Extensions::default() };
        assert_eq!(ack.emit_packet(&mut [0u8; 64], &[]), Err(Error::Reserved));
    }

    #[test]
    fn rejects_inconsistent_padding_and_truncation() {
        let headers = Headers { bth: bth(Opcode::RcSendOnly), ext: Extensions::default() };
        let mut buf = [0u8; 32];
        let len = headers.emit_packet(&mut buf, b"hello").unwrap();
        assert_eq!(len, 12 + 8 + 4);
        assert_eq!(PacketRepr::parse(&buf[..len]).unwrap().payload, b"hello");
        assert_eq!(PacketRepr::parse(&buf[..len - 1]), Err(Error::BadPadding));
        assert_eq!(PacketRepr::parse(&buf[..15]), Err(Error::Truncated));
        // An ACK may not carry a payload.
        let mut ack = [0u8; 24];
        ack[0] = Opcode::RcAck as u8;
        assert_eq!(PacketRepr::parse(&ack), Err(Error::BadPadding));
    }

    #[test]
    fn selective_repeat_write_middle_literal_bytes() {
        let headers = Headers {
            bth: bth::Repr { selective_repeat: true, ..bth(Opcode::RcWriteMiddle) },
            ext: Extensions {
                sreth: Some(sreth::Repr {
                    virtual_address: 0x1000,
                    rkey: 0x55,
                    message_length: 12,
                    offset: 4,
                    receive_number: 2,
                }),
                ..Extensions::default()
            },
        };
        let mut buf = [0u8; 64];
        let len = headers.emit_packet(&mut buf, b"wxyz").unwrap();
        #[rustfmt::skip]
        let expected: &[u8] = &[
            0x07, 0x01, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x80, 0x00, 0x00, 0x07, // BTH, TVer 1
            0, 0, 0, 0, 0, 0, 0x10, 0x00, 0, 0, 0, 0x55, 0, 0, 0, 12,                // SRETH: va, rkey, length
            0, 0, 0, 4, 0, 0, 0, 2,                                                  //   offset, receive
            b'w', b'x', b'y', b'z',                                                  // payload
            0, 0, 0, 0,                                                              // ICRC slot
        ];
        assert_eq!(&buf[..len], expected);
        let parsed = PacketRepr::parse(expected).unwrap();
        assert_eq!(
            (parsed.headers, parsed.payload),
            (Headers { bth: bth::Repr { pad_count: 0, ..headers.bth }, ..headers }, &b"wxyz"[..])
        );
        // Without TVer 1 the same bytes are a WRITE MIDDLE whose payload
        // starts with the SRETH: the version is what tells them apart.
        let mut plain = expected.to_vec();
        plain[1] = 0;
        assert_eq!(PacketRepr::parse(&plain).unwrap().payload.len(), 28);
    }

    #[test]
    fn selective_nak_literal_bytes_and_versions_elsewhere_rejected() {
        let mut sack = sack::Repr::default();
        sack.set_received(0);
        sack.set_received(9);
        let headers = Headers {
            bth: bth::Repr { selective_repeat: true, ..bth(Opcode::RcAck) },
            ext: Extensions {
                aeth: Some(aeth::Repr { syndrome: aeth::Syndrome::Nak(aeth::NakCode::PsnSequenceError), msn: 3 }),
                sack: Some(sack),
                ..Extensions::default()
            },
        };
        let mut buf = [0u8; 96];
        let len = headers.emit_packet(&mut buf, &[]).unwrap();
        assert_eq!(len, 12 + 4 + 64 + 4);
        assert_eq!(&buf[12..20], &[0x60, 0, 0, 3, 0x80, 0x40, 0, 0]);
        assert!(buf[20..80].iter().all(|b| *b == 0));
        assert_eq!(PacketRepr::parse(&buf[..len]).unwrap().headers.ext, headers.ext);
        // Version 1 means nothing on a READ request: refused both ways.
        let read = Headers {
            bth: bth::Repr { selective_repeat: true, ..bth(Opcode::RcReadRequest) },
            ext: Extensions {
                reth: Some(reth::Repr { virtual_address: 0, rkey: 1, dma_length: 8 }),
                ..Extensions::default()
            },
        };
        assert_eq!(read.emit_packet(&mut buf, &[]), Err(Error::UnsupportedVersion(1)));
        let mut bytes = [0u8; 32];
        let plain = Headers { bth: bth::Repr { selective_repeat: false, ..read.bth }, ..read };
        let len = plain.emit_packet(&mut bytes, &[]).unwrap();
        bytes[1] |= 1;
        assert_eq!(PacketRepr::parse(&bytes[..len]), Err(Error::UnsupportedVersion(1)));
    }
}
