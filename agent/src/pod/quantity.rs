//! Kubernetes resource quantities (`250m`, `1.5Gi`, `12E-3`), parsed exactly with integer
//! decimal arithmetic (no floating point: `2.007` cpu is 2007m, not 2008m).
//!
//! The format: an optional sign, digits with an optional fraction (`1`, `1.5`, `.5`, `5.`), then at
//! most one suffix: a binary multiple (`Ki Mi Gi Ti Pi Ei`, powers of 1024), a decimal multiple
//! (`n u m k M G T P E`, or none) or a decimal exponent (`e` or `E`, then a signed integer: `1e3`,
//! `12E-3`). Nothing else is accepted, not even surrounding spaces.
//!
//! A value is kept as the API keeps it: its magnitude rounded up to a whole nano-unit (a tiny
//! non-zero amount stays non-zero), and at most 2^63-1 units. The API silently caps larger values;
//! this parser refuses them. [`Quantity::milli_value`] and [`Quantity::value`] round the magnitude
//! up as the API's `MilliValue()` and `Value()` do: `0.0001` cpu is 1m, `2.0071` is 2008m, `0.5Ki`
//! is 512, `1m` bytes is 1.

use std::str::FromStr;

const NANOS_PER_UNIT: i128 = 1_000_000_000;
const NANOS_PER_MILLI: i128 = 1_000_000;
/// The largest magnitude, in nano-units: 2^63-1 whole units.
const MAX_NANOS: u128 = i64::MAX as u128 * NANOS_PER_UNIT as u128;
/// Decimal digits of [`MAX_NANOS`]: a whole part with more digits is out of range.
const MAX_NANOS_DIGITS: usize = 28;

/// A parsed quantity: a whole number of nano-units (see the module docs for the rounding).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    nanos: i128,
}

/// Why a quantity's text was refused. Each variant names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("quantity {text:?} is malformed: {reason}")]
    Syntax { text: String, reason: &'static str },
    #[error("quantity {text:?} is out of range: its magnitude is over 2^63-1")]
    OutOfRange { text: String },
    #[error("quantity {text:?} is negative, and a resource amount cannot be")]
    Negative { text: String },
}

impl Quantity {
    pub const ZERO: Quantity = Quantity { nanos: 0 };

    /// Parses any quantity the API accepts, negative ones included.
    pub fn parse(text: &str) -> Result<Quantity, Error> {
        parse(text)
    }

    /// Parses a resource amount (a request, limit or overhead): as [`Quantity::parse`], but a
    /// negative value is refused. `-0` is zero, and accepted.
    pub fn parse_amount(text: &str) -> Result<Quantity, Error> {
        let q = parse(text)?;
        if q.nanos < 0 {
            return Err(Error::Negative {
                text: text.to_owned(),
            });
        }
        Ok(q)
    }

    /// The value in nano-units.
    pub fn nanos(self) -> i128 {
        self.nanos
    }

    pub fn is_zero(self) -> bool {
        self.nanos == 0
    }

    /// The value in thousandths, the magnitude rounded up (`MilliValue()`).
    pub fn milli_value(self) -> i128 {
        div_away_from_zero(self.nanos, NANOS_PER_MILLI)
    }

    /// The value in whole units, the magnitude rounded up (`Value()`).
    pub fn value(self) -> i128 {
        div_away_from_zero(self.nanos, NANOS_PER_UNIT)
    }

    /// The sum; saturates rather than wraps (only reachable with ~10^10 maximal amounts).
    pub fn saturating_add(self, other: Quantity) -> Quantity {
        Quantity {
            nanos: self.nanos.saturating_add(other.nanos),
        }
    }
}

impl FromStr for Quantity {
    type Err = Error;

    fn from_str(text: &str) -> Result<Quantity, Error> {
        parse(text)
    }
}

/// `n / d` with the quotient's magnitude rounded up; `d > 0`.
fn div_away_from_zero(n: i128, d: i128) -> i128 {
    let q = n / d;
    if n % d == 0 { q } else { q + n.signum() }
}

/// The power of ten and the power of two a suffix multiplies by.
fn suffix(s: &[u8]) -> Result<(i128, u32), &'static str> {
    Ok(match s {
        b"" => (0, 0),
        b"n" => (-9, 0),
        b"u" => (-6, 0),
        b"m" => (-3, 0),
        b"k" => (3, 0),
        b"M" => (6, 0),
        b"G" => (9, 0),
        b"T" => (12, 0),
        b"P" => (15, 0),
        b"E" => (18, 0),
        b"Ki" => (0, 10),
        b"Mi" => (0, 20),
        b"Gi" => (0, 30),
        b"Ti" => (0, 40),
        b"Pi" => (0, 50),
        b"Ei" => (0, 60),
        [b'e' | b'E', exponent @ ..] => (decimal_exponent(exponent)?, 0),
        _ => {
            return Err(
                "unknown suffix (expected one of Ki Mi Gi Ti Pi Ei n u m k M G T P E, or an exponent such as e3)",
            );
        }
    })
}

/// The signed integer after `e`/`E`.
fn decimal_exponent(s: &[u8]) -> Result<i128, &'static str> {
    let (negative, digits) = match s {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err("an exponent (e or E) must be followed by a signed integer");
    }
    let mut v: i64 = 0;
    for d in digits {
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(i64::from(d - b'0')))
            .ok_or("the exponent is out of range")?;
    }
    Ok(if negative {
        -i128::from(v)
    } else {
        i128::from(v)
    })
}

fn parse(text: &str) -> Result<Quantity, Error> {
    let syntax = |reason| Error::Syntax {
        text: text.to_owned(),
        reason,
    };
    if text.is_empty() {
        return Err(syntax("it is empty"));
    }
    let b = text.as_bytes();
    let (negative, rest) = match b {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, b),
    };
    let digits = |s: &[u8]| s.iter().take_while(|c| c.is_ascii_digit()).count();
    let (whole, rest) = rest.split_at(digits(rest));
    let (fraction, rest) = match rest {
        [b'.', after @ ..] => after.split_at(digits(after)),
        _ => (&[][..], rest),
    };
    if whole.is_empty() && fraction.is_empty() {
        return Err(syntax("it has no digits"));
    }
    let (exp10, exp2) = suffix(rest).map_err(syntax)?;

    // The digits, least significant first, and the power of ten that scales them to nano-units.
    let mut ds: Vec<u8> = whole
        .iter()
        .chain(fraction)
        .rev()
        .map(|c| c - b'0')
        .collect();
    let mut scale = exp10 - fraction.len() as i128 + 9;
    let low_zeros = ds.iter().take_while(|&&d| d == 0).count();
    if low_zeros == ds.len() {
        return Ok(Quantity::ZERO);
    }
    ds.drain(..low_zeros);
    scale += low_zeros as i128;
    while ds.last() == Some(&0) {
        ds.pop();
    }
    if exp2 > 0 {
        multiply(&mut ds, 1u64 << exp2);
    }

    // Digits below the nano place round the magnitude up.
    let out_of_range = || Error::OutOfRange {
        text: text.to_owned(),
    };
    let dropped = usize::try_from(-scale.min(0)).unwrap_or(usize::MAX);
    let whole_digits = ds.len() as i128 + scale;
    if whole_digits > MAX_NANOS_DIGITS as i128 {
        return Err(out_of_range());
    }
    let below = ds.iter().take(dropped).any(|&d| d != 0);
    let mut magnitude: u128 = 0;
    for &d in ds.iter().skip(dropped).rev() {
        magnitude = magnitude * 10 + u128::from(d);
    }
    for _ in 0..scale.max(0) {
        magnitude *= 10;
    }
    magnitude += u128::from(below);
    if magnitude > MAX_NANOS {
        return Err(out_of_range());
    }
    // MAX_NANOS < 2^127: the cast is exact.
    let nanos = magnitude as i128;
    Ok(Quantity {
        nanos: if negative { -nanos } else { nanos },
    })
}

/// `ds` (decimal digits, least significant first) times `factor`.
fn multiply(ds: &mut Vec<u8>, factor: u64) {
    let mut carry: u128 = 0;
    for d in ds.iter_mut() {
        let x = u128::from(*d) * u128::from(factor) + carry;
        *d = (x % 10) as u8;
        carry = x / 10;
    }
    while carry > 0 {
        ds.push((carry % 10) as u8);
        carry /= 10;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str) -> Quantity {
        match Quantity::parse(text) {
            Ok(q) => q,
            Err(e) => panic!("{text:?}: {e}"),
        }
    }

    #[test]
    fn cpu_milli_values() {
        for (text, milli) in [
            ("0.0001", 1),
            ("2.0071", 2008),
            ("2.007", 2007),
            ("16.1", 16_100),
            ("250m", 250),
            ("0.5", 500),
            (".5", 500),
            ("5.", 5000),
            ("2", 2000),
            ("+1", 1000),
            ("1n", 1),
            ("1u", 1),
            ("999999n", 1),
            ("1000001n", 2),
            ("1e3", 1_000_000),
            ("12E-3", 12),
            ("12e-4", 2),
            ("1.5e+2", 150_000),
            ("1.e3", 1_000_000),
            ("0.000000001m", 1),
            ("1e-30", 1),
            ("0e999", 0),
            ("-0", 0),
            ("000", 0),
            ("0.000", 0),
            ("00012.3400", 12_340),
            ("0.1m", 1),
            ("-2.0071", -2008),
            ("-1n", -1),
        ] {
            assert_eq!(q(text).milli_value(), milli, "{text}");
        }
    }

    #[test]
    fn integer_values() {
        for (text, value) in [
            ("1.5k", 1500),
            ("0.5Ki", 512),
            ("1m", 1),
            ("1001m", 2),
            ("128Mi", 128 << 20),
            ("1G", 1_000_000_000),
            ("1.5Gi", 3 << 29),
            ("0.0000000001Ki", 1),
            ("1E", 1_000_000_000_000_000_000),
            ("7Ei", 7 << 60),
            ("1e18", 1_000_000_000_000_000_000),
            ("9223372036854775807", i64::MAX as i128),
            ("9223372036854775.807k", i64::MAX as i128),
            ("8191.999999999999999Pi", i64::MAX as i128),
            ("-1.5k", -1500),
            ("-1m", -1),
        ] {
            assert_eq!(q(text).value(), value, "{text}");
        }
        // Exact below the unit: 100m and 0.1 are the same amount, 1m is not 1n.
        assert_eq!(q("100m"), q("0.1"));
        assert_eq!(q("1Ki"), q("1024"));
        assert_eq!(q("1e3"), q("1k"));
        assert_ne!(q("1m"), q("1n"));
        assert_eq!(q("1n").nanos(), 1);
        assert_eq!(q("1e-10").nanos(), 1);
        assert_eq!("2.5".parse::<Quantity>(), Ok(q("2500m")));
    }

    #[test]
    fn malformed_text_is_refused_and_named() {
        for text in [
            "",
            " ",
            " 1",
            "1 ",
            "1 Gi",
            "1.2.3",
            "1.5.5",
            "Mi",
            "-Mi",
            "1mi",
            "1ki",
            "1K",
            "1KiB",
            "1Ki3",
            "1e3Ki",
            "1kk",
            "-",
            "+",
            ".",
            "-.",
            "--1",
            "+-1",
            "1-",
            "1e",
            "1E+",
            "1e-",
            "1e3.5",
            "1e 3",
            "1ee3",
            "0x10",
            "1_000",
            "1,5",
            "\u{ff11}",
            "1e99999999999999999999",
            "NaN",
            "inf",
        ] {
            match Quantity::parse(text) {
                Err(e @ Error::Syntax { .. }) => {
                    assert!(e.to_string().contains(&format!("{text:?}")), "{e}");
                }
                other => panic!("{text:?}: expected a syntax error, got {other:?}"),
            }
        }
    }

    #[test]
    fn out_of_range_and_negative_amounts_are_refused() {
        for text in [
            "9223372036854775808",
            "9223372036854775807.000000001",
            "8Ei",
            "10E",
            "1e19",
            "1e99999",
            "-9223372036854775808",
            "99999999999999999999999999999999999999999999",
        ] {
            let e = Quantity::parse(text).expect_err(text);
            assert_eq!(
                e,
                Error::OutOfRange {
                    text: text.to_owned()
                }
            );
        }
        // Digits below the nano place round up: this one rounds past the largest value.
        assert!(Quantity::parse("9223372036854775807.0000000001").is_err());
        assert_eq!(q("-1").value(), -1);
        let e = Quantity::parse_amount("-1").expect_err("negative");
        assert_eq!(
            e.to_string(),
            "quantity \"-1\" is negative, and a resource amount cannot be"
        );
        assert!(Quantity::parse_amount("-1n").is_err());
        assert_eq!(
            Quantity::parse_amount("-0").map(Quantity::is_zero),
            Ok(true)
        );
        assert_eq!(
            Quantity::parse_amount("0.5").map(Quantity::milli_value),
            Ok(500)
        );
    }

    #[test]
    fn long_texts_are_exact() {
        let tiny = format!("0.{}1", "0".repeat(5000));
        assert_eq!(q(&tiny).nanos(), 1);
        let one = format!("1.{}1", "0".repeat(5000));
        assert_eq!(q(&one).nanos(), 1_000_000_001);
        assert_eq!(q(&one).milli_value(), 1001);
        let padded = format!("{}2.5{}", "0".repeat(5000), "0".repeat(5000));
        assert_eq!(q(&padded).milli_value(), 2500);
    }

    /// splitmix64: a fixed, seedable sequence, so every run checks the same values.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        fn digits(&mut self, n: u64) -> String {
            (0..n)
                .map(|_| char::from(b'0' + self.below(10) as u8))
                .collect()
        }
    }

    /// `ceil(n * 2^b * 10^k)` for non-negative `n`, or None when it does not fit in a u128.
    fn ceil_scaled(n: u128, b: u32, k: i32) -> Option<u128> {
        let numer = n.checked_mul(1u128 << b)?;
        if k >= 0 {
            return numer.checked_mul(10u128.checked_pow(k.unsigned_abs())?);
        }
        let denom = 10u128.checked_pow(k.unsigned_abs())?;
        Some(numer.div_ceil(denom))
    }

    /// One generated quantity: its text, and what it must parse to (sign, then the magnitudes in
    /// nano-units, milli-units and units), or None when it is out of range.
    fn generated(rng: &mut Rng) -> (String, Option<(bool, u128, u128, u128)>) {
        let mut whole_len = rng.below(11);
        let frac_len = rng.below(10);
        if whole_len + frac_len == 0 {
            whole_len = 1;
        }
        let whole = rng.digits(whole_len);
        let frac = rng.digits(frac_len);
        let sign = ["", "+", "-"][rng.below(3) as usize];
        let number = match (frac_len, rng.below(2)) {
            (0, 0) => whole.clone(),
            (0, _) => format!("{whole}."),
            _ => format!("{whole}.{frac}"),
        };
        const DECIMAL: [(&str, i32); 10] = [
            ("n", -9),
            ("u", -6),
            ("m", -3),
            ("", 0),
            ("k", 3),
            ("M", 6),
            ("G", 9),
            ("T", 12),
            ("P", 15),
            ("E", 18),
        ];
        const BINARY: [(&str, u32); 6] = [
            ("Ki", 10),
            ("Mi", 20),
            ("Gi", 30),
            ("Ti", 40),
            ("Pi", 50),
            ("Ei", 60),
        ];
        let (suffix, e, b) = match rng.below(3) {
            0 => {
                let (s, e) = DECIMAL[rng.below(10) as usize];
                (s.to_owned(), e, 0)
            }
            1 => {
                let (s, b) = BINARY[rng.below(6) as usize];
                (s.to_owned(), 0, b)
            }
            _ => {
                let e = rng.below(51) as i32 - 25;
                let letter = if rng.below(2) == 0 { "e" } else { "E" };
                let sign = match (e < 0, rng.below(2)) {
                    (true, _) => "-",
                    (false, 0) => "+",
                    (false, _) => "",
                };
                let pad = "0".repeat(rng.below(3) as usize);
                (format!("{letter}{sign}{pad}{}", e.unsigned_abs()), e, 0)
            }
        };
        let text = format!("{sign}{number}{suffix}");
        // The digits as one integer n: the value is n * 2^b * 10^(e - frac_len).
        let n: u128 = format!("{whole}{frac}").parse().expect("at most 19 digits");
        let k = e - frac_len as i32;
        let expected = ceil_scaled(n, b, k + 9)
            .filter(|&nanos| nanos <= i64::MAX as u128 * 1_000_000_000)
            .map(|nanos| {
                let milli = ceil_scaled(n, b, k + 3).expect("smaller than the nanos");
                let units = ceil_scaled(n, b, k).expect("smaller than the nanos");
                (sign == "-", nanos, milli, units)
            });
        (text, expected)
    }

    #[test]
    fn generated_quantities_match_integer_arithmetic() {
        let mut rng = Rng(0x005e_ed0f_9a7a);
        let (mut in_range, mut negative, mut fractional) = (0, 0, 0);
        for _ in 0..140_000 {
            let (text, expected) = generated(&mut rng);
            let got = Quantity::parse(&text);
            let Some((neg, nanos, milli, units)) = expected else {
                assert_eq!(got, Err(Error::OutOfRange { text }), "out of range");
                continue;
            };
            let q = got.unwrap_or_else(|e| panic!("{text:?}: {e}"));
            let signed = |m: u128| if neg { -(m as i128) } else { m as i128 };
            assert_eq!(q.nanos(), signed(nanos), "{text} nanos");
            assert_eq!(q.milli_value(), signed(milli), "{text} milli");
            assert_eq!(q.value(), signed(units), "{text} value");
            assert_eq!(Quantity::parse_amount(&text).is_ok(), !neg || nanos == 0);
            in_range += 1;
            negative += usize::from(neg && nanos > 0);
            fractional += usize::from(nanos % 1_000_000_000 != 0);
        }
        // The generator covers what it should: mostly values in range, signs and fractions.
        assert!(in_range >= 100_000, "only {in_range} in range");
        assert!(negative >= 20_000, "only {negative} negative");
        assert!(fractional >= 20_000, "only {fractional} with a fraction");
    }
}
