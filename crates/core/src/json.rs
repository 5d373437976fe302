//! Numbers in the JSON files the crates write and read back (run summaries, simulation
//! reports). JSON has no NaN or infinity: `serde_json` writes them as `null`. These read a
//! `null` back as NaN, so a figure that was not a number round-trips, while a field that is
//! missing altogether stays an error naming it (use them with `deserialize_with`, without
//! `default`).

use serde::{Deserialize, Deserializer};

/// A number, or NaN where the file has `null` (a NaN or an infinity when it was written).
pub fn nan_if_null<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
}

/// A list of numbers, with NaN where the file has `null`.
pub fn nans_if_null<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<f64>, D::Error> {
    let numbers = Vec::<Option<f64>>::deserialize(deserializer)?;
    Ok(numbers.into_iter().map(|v| v.unwrap_or(f64::NAN)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Figures {
        #[serde(deserialize_with = "nan_if_null")]
        one: f64,
        #[serde(deserialize_with = "nans_if_null")]
        many: Vec<f64>,
    }

    #[test]
    fn null_reads_as_nan_and_a_missing_field_is_an_error_naming_it() {
        let f: Figures = serde_json::from_str(r#"{"one": null, "many": [1.5, null]}"#).unwrap();
        assert!(f.one.is_nan());
        assert_eq!(f.many[0], 1.5);
        assert!(f.many[1].is_nan());
        let f: Figures = serde_json::from_str(r#"{"one": 2.0, "many": []}"#).unwrap();
        assert_eq!(f.one, 2.0);
        let err = serde_json::from_str::<Figures>(r#"{"many": []}"#).unwrap_err();
        assert!(err.to_string().contains("missing field `one`"), "{err}");
    }
}
