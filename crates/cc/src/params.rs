//! Parameters, as users write them: `key=value` pairs separated by commas
//! (`--cc-param rpg_ai_rate=10,rpg_hai_rate=100`, `SOFTRNIC_CC_PARAMS`).
//! An algorithm reads the keys it knows; a key nobody read is an error,
//! so a typo is never silently ignored. No allocation: the text is walked
//! each time, which costs nothing next to building a QP.

use core::fmt;

/// The parameter text of one algorithm.
#[derive(Debug, Clone, Copy)]
pub struct Params<'a> {
    text: &'a str,
}

/// A parameter that could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamError<'a> {
    /// Not of the form `key=value`.
    Malformed(&'a str),
    /// The value is not a number this key takes.
    BadValue { key: &'a str, value: &'a str },
    /// No key of that name.
    Unknown { key: &'a str, known: &'static [&'static str] },
}

impl fmt::Display for ParamError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamError::Malformed(pair) => write!(f, "`{pair}` is not key=value"),
            ParamError::BadValue { key, value } => write!(f, "{key}={value}: give a non-negative number"),
            ParamError::Unknown { key, known } => {
                write!(f, "no parameter `{key}`; this algorithm takes ")?;
                for (i, name) in known.iter().enumerate() {
                    write!(f, "{}{name}", if i == 0 { "" } else { ", " })?;
                }
                Ok(())
            }
        }
    }
}

impl<'a> Params<'a> {
    pub const NONE: Params<'static> = Params { text: "" };

    pub fn new(text: &'a str) -> Params<'a> {
        Params { text }
    }

    pub fn text(&self) -> &'a str {
        self.text
    }

    fn pairs(&self) -> impl Iterator<Item = Result<(&'a str, &'a str), ParamError<'a>>> {
        self.text.split(',').map(str::trim).filter(|p| !p.is_empty()).map(|pair| {
            let (key, value) = pair.split_once('=').ok_or(ParamError::Malformed(pair))?;
            Ok((key.trim(), value.trim()))
        })
    }

    /// Checks that every key is one of `known` and well formed.
    pub fn check(&self, known: &'static [&'static str]) -> Result<(), ParamError<'a>> {
        for pair in self.pairs() {
            let (key, _) = pair?;
            if !known.contains(&key) {
                return Err(ParamError::Unknown { key, known });
            }
        }
        Ok(())
    }

    /// The value of `key` as a number, or `default`. The last mention wins.
    pub fn get(&self, key: &str, default: f64) -> Result<f64, ParamError<'a>> {
        let mut found = default;
        for pair in self.pairs() {
            let (k, value) = pair?;
            if k == key {
                found = match value.parse::<f64>() {
                    Ok(v) if v >= 0.0 && v.is_finite() => v,
                    _ => return Err(ParamError::BadValue { key: k, value }),
                };
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_values_and_rejects_typos() {
        let p = Params::new("rpg_ai_rate=10, rpg_hai_rate = 100");
        assert_eq!(p.get("rpg_ai_rate", 5.0), Ok(10.0));
        assert_eq!(p.get("rpg_gd", 11.0), Ok(11.0));
        assert!(p.check(&["rpg_ai_rate", "rpg_hai_rate"]).is_ok());
        assert_eq!(
            p.check(&["rpg_ai_rate"]),
            Err(ParamError::Unknown { key: "rpg_hai_rate", known: &["rpg_ai_rate"] })
        );
        assert_eq!(Params::new("x").check(&["x"]), Err(ParamError::Malformed("x")));
        assert_eq!(Params::new("x=-1").get("x", 0.0), Err(ParamError::BadValue { key: "x", value: "-1" }));
        assert_eq!(Params::new("x=nan").get("x", 0.0), Err(ParamError::BadValue { key: "x", value: "nan" }));
    }
}
