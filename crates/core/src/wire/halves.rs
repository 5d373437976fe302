//! Values on the wire as 16-bit floats: a data frame whose [`Flags::float`] is
//! [`WireFloat::Bf16`] or [`WireFloat::F16`] carries its `length` values rounded to that
//! float, two to each little-endian 32-bit word of payload (the first in the low half; an
//! odd last value padded with zero bits), so a frame moves half the bytes of its `f32`
//! form. A payload stays a whole number of `f32` words, so the drivers read and write it
//! as they read and write `f32` values; only the endpoint that packs and unpacks
//! ([`crate::strategy::HalfWire`]) knows what the words hold.
//!
//! [`Flags::float`]: super::Flags::float

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};

/// The float a data frame's values travel as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WireFloat {
    /// 32-bit IEEE floats, as computed (the default).
    #[default]
    F32,
    /// bfloat16: f32's range, 8 bits of precision.
    Bf16,
    /// IEEE half: 11 bits of precision, values up to 65,504.
    F16,
}

impl WireFloat {
    /// Its two bits in a header's flags.
    pub(super) fn bits(self) -> u32 {
        match self {
            WireFloat::F32 => 0,
            WireFloat::Bf16 => 1,
            WireFloat::F16 => 2,
        }
    }

    /// The float of two flag bits, if they name one.
    pub(super) fn from_bits(bits: u32) -> Option<Self> {
        match bits {
            0 => Some(WireFloat::F32),
            1 => Some(WireFloat::Bf16),
            2 => Some(WireFloat::F16),
            _ => None,
        }
    }

    /// Bytes of payload that carry `length` values.
    pub fn payload_bytes(self, length: u32) -> u64 {
        match self {
            WireFloat::F32 => u64::from(length) * 4,
            WireFloat::Bf16 | WireFloat::F16 => packed_words(length as usize) as u64 * 4,
        }
    }

    /// `value` rounded to this float (to nearest, ties to even) and back, one at a time
    /// ([`round_all`] for many).
    pub fn round(self, value: f32) -> f32 {
        match self {
            WireFloat::F32 => value,
            WireFloat::Bf16 => bf16::from_f32(value).to_f32(),
            WireFloat::F16 => f16::from_f32(value).to_f32(),
        }
    }
}

/// The bits of `value` as bfloat16, rounded to nearest (ties to even), NaN kept a quiet NaN:
/// what `half::bf16::from_f32` gives, in a form the compiler vectorises.
#[inline(always)]
fn bf16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let quiet_nan = (bits >> 16) | 0x40;
    (if value.is_nan() { quiet_nan } else { rounded }) as u16
}

/// Writes `values` rounded to `float` (Bf16 or F16; F32 writes nothing) as 16-bit floats
/// into `out`, which has one element per value.
pub fn narrow(values: &[f32], float: WireFloat, out: &mut [u16]) {
    match float {
        WireFloat::F32 => {}
        WireFloat::Bf16 => simd::narrow_bf16(values, out),
        // F16C's conversions where the CPU has them (detected once per call).
        WireFloat::F16 => out
            .reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(values),
    }
}

/// Writes the 16-bit floats `bits` of `float` (Bf16 or F16) as `f32`s into `out`.
pub fn widen(bits: &[u16], float: WireFloat, out: &mut [f32]) {
    match float {
        WireFloat::F32 => {}
        WireFloat::Bf16 => simd::widen_bf16(bits, out),
        WireFloat::F16 => bits.reinterpret_cast::<f16>().convert_to_f32_slice(out),
    }
}

/// The bfloat16 loops, compiled a second time for AVX2 and chosen at run time: the
/// baseline x86-64 has no instruction that narrows 32-bit lanes to 16, so the baseline
/// loop converts one value at a time, the AVX2 one eight.
mod simd {
    use super::bf16_bits;

    #[inline(always)]
    fn narrow_loop(values: &[f32], out: &mut [u16]) {
        for (o, &v) in out.iter_mut().zip(values) {
            *o = bf16_bits(v);
        }
    }

    #[inline(always)]
    fn widen_loop(bits: &[u16], out: &mut [f32]) {
        for (o, &b) in out.iter_mut().zip(bits) {
            *o = f32::from_bits(u32::from(b) << 16);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn narrow_avx2(values: &[f32], out: &mut [u16]) {
        narrow_loop(values, out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn widen_avx2(bits: &[u16], out: &mut [f32]) {
        widen_loop(bits, out);
    }

    /// `out[i]` = `values[i]` as bfloat16 bits.
    pub(super) fn narrow_bf16(values: &[f32], out: &mut [u16]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (just detected).
            return unsafe { narrow_avx2(values, out) };
        }
        narrow_loop(values, out);
    }

    /// `out[i]` = the bfloat16 `bits[i]` as f32.
    pub(super) fn widen_bf16(bits: &[u16], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (just detected).
            return unsafe { widen_avx2(bits, out) };
        }
        widen_loop(bits, out);
    }
}

/// The 32-bit words that hold `length` packed 16-bit values.
pub fn packed_words(length: usize) -> usize {
    length.div_ceil(2)
}

/// Packs `values`, rounded to `float` (Bf16 or F16), into `out`, which must hold
/// [`packed_words`] of them; the words are `f32`s only as a container of bits.
pub fn pack(values: &[f32], float: WireFloat, out: &mut [f32]) {
    debug_assert_eq!(out.len(), packed_words(values.len()));
    let halves: &mut [u16] = bytemuck::cast_slice_mut(out);
    let (used, padding) = halves.split_at_mut(values.len().min(halves.len()));
    padding.fill(0);
    narrow(values, float, used);
}

/// Unpacks the `out.len()` values of `float` held in `packed` into `out`.
pub fn unpack(packed: &[f32], float: WireFloat, out: &mut [f32]) {
    debug_assert_eq!(packed.len(), packed_words(out.len()));
    let halves: &[u16] = bytemuck::cast_slice(packed);
    widen(&halves[..out.len().min(halves.len())], float, out);
}

/// Rounds every value of `values` to `float`, in place.
pub fn round_all(values: &mut [f32], float: WireFloat) {
    let mut bits = [0u16; 512];
    for chunk in values.chunks_mut(bits.len()) {
        let bits = &mut bits[..chunk.len()];
        narrow(chunk, float, bits);
        widen(bits, float, chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{FrameKind, Header, DEFAULT_MAX_PAYLOAD};
    use proptest::prelude::*;

    #[test]
    fn a_half_frame_announces_half_the_bytes_and_decodes() {
        for (length, bytes) in [(0, 0), (1, 4), (2, 4), (3, 8), (1000, 2000)] {
            let h = Header::data(FrameKind::Reduce, 3, 1, 0, length).with_float(WireFloat::Bf16);
            assert_eq!(u64::from(h.payload_len), bytes);
            let back = Header::decode(&h.encode(), DEFAULT_MAX_PAYLOAD).expect("decodes");
            assert_eq!(back.flags.float(), WireFloat::Bf16);
            assert_eq!(back, h);
        }
        // A half frame that announces f32's bytes is refused, and so are unknown floats.
        let mut h = Header::data(FrameKind::Reduce, 3, 1, 0, 10).with_float(WireFloat::F16);
        h.payload_len = 40;
        assert!(Header::decode(&h.encode(), DEFAULT_MAX_PAYLOAD).is_err());
        let mut b = Header::data(FrameKind::Reduce, 3, 1, 0, 0).encode();
        b[44] = 0b1100_0000;
        assert!(Header::decode(&b, DEFAULT_MAX_PAYLOAD).is_err());
    }

    proptest! {
        /// Packing rounds each value to the float once, as `half` rounds it; unpacking gives
        /// those values back, whatever the length's parity.
        #[test]
        fn pack_then_unpack_is_rounding(
            mut values in prop::collection::vec(-1e6f32..1e6, 0..41),
            specials in prop::collection::vec(0usize..6, 0..4),
        ) {
            let special = [f32::NAN, f32::INFINITY, -0.0, 3.4e38, 1e-40, 65520.0];
            values.extend(specials.iter().map(|&i| special[i]));
            for float in [WireFloat::Bf16, WireFloat::F16] {
                let mut packed = vec![0.0; packed_words(values.len())];
                pack(&values, float, &mut packed);
                let mut back = vec![0.0; values.len()];
                unpack(&packed, float, &mut back);
                let one_by_one: Vec<f32> = values.iter().map(|&v| float.round(v)).collect();
                let mut rounded = values.clone();
                round_all(&mut rounded, float);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(&back), bits(&one_by_one));
                prop_assert_eq!(bits(&rounded), bits(&one_by_one));
            }
        }
    }
}
