//! C printf formats nccl-tests' table uses (`%g`, `%*.Nf`, `%*.Ne`), reproduced exactly.

/// C's `%.{prec}e`: mantissa, `e`, sign, at least two exponent digits.
pub fn c_exp(value: f64, prec: usize) -> String {
    let s = format!("{value:.prec$e}");
    match s.split_once('e') {
        Some((mant, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            format!("{mant}e{sign}{digits:0>2}")
        }
        None => s, // inf / NaN
    }
}

/// C's `%g` (precision 6).
pub fn c_g(value: f64) -> String {
    if value == 0.0 {
        return if value.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    if !value.is_finite() {
        return if value.is_nan() {
            "nan".into()
        } else if value > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    const P: i32 = 6;
    // The exponent after rounding to P significant digits decides the style.
    let e = c_exp(value, (P - 1) as usize);
    let x: i32 = e.split_once('e').map(|(_, x)| x.parse().unwrap()).unwrap();
    if !(-4..P).contains(&x) {
        let (mant, exp) = e.split_once('e').unwrap();
        format!("{}e{}", strip_zeros(mant), exp)
    } else {
        let prec = (P - 1 - x) as usize;
        strip_zeros(&format!("{value:.prec$}")).to_string()
    }
}

fn strip_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// nccl-tests' `getFloatStr`: the most precise of `%.2f`, `%.1f`, `%.0f` that fits `width`,
/// else `%.1e` (width >= 7) / `%.0e`; right-aligned to `width`.
pub fn float_str(value: f64, width: usize) -> String {
    for prec in [2usize, 1, 0] {
        let s = format!("{value:>width$.prec$}");
        if s.len() <= width {
            return s;
        }
    }
    let s = c_exp(value, if width >= 7 { 1 } else { 0 });
    format!("{s:>width$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g_matches_c() {
        assert_eq!(c_g(0.0), "0");
        assert_eq!(c_g(3.0), "3");
        assert_eq!(c_g(123456.0), "123456");
        assert_eq!(c_g(1234567.0), "1.23457e+06");
        assert_eq!(c_g(16777216.0), "1.67772e+07");
        assert_eq!(c_g(0.5), "0.5");
        assert_eq!(c_g(2.345678912), "2.34568");
        assert_eq!(c_g(0.0001234), "0.0001234");
        assert_eq!(c_g(0.00001234), "1.234e-05");
        assert_eq!(c_g(999999.5), "1e+06");
        assert_eq!(c_g(1e100), "1e+100");
    }

    #[test]
    fn float_str_matches_nccl_tests() {
        assert_eq!(float_str(12.345, 7), "  12.35");
        assert_eq!(float_str(0.0, 6), "  0.00");
        assert_eq!(float_str(123456.7, 7), " 123457");
        assert_eq!(float_str(1234.567, 6), "1234.6");
        assert_eq!(float_str(123456.7, 6), "123457");
        assert_eq!(float_str(12345678.0, 7), "1.2e+07");
        assert_eq!(float_str(12345678.0, 6), " 1e+07");
    }
}
