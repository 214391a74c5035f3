//! `string_enum!`: a state that travels as a string (over D-Bus, in JSON
//! records and reports) but is matched as an enum in code. Unknown strings
//! are kept as `Other`, so a newer systemd or an older record never fails
//! to parse and is written back unchanged.

macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value this build does not know, kept as it came.
            Other(String),
        }

        impl $name {
            /// Every value this build knows, in declaration order.
            #[allow(dead_code)]
            pub fn known() -> Vec<$name> {
                vec![$( $name::$variant, )+]
            }

            pub fn as_str(&self) -> &str {
                match self {
                    $( $name::$variant => $text, )+
                    $name::Other(s) => s,
                }
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                match s {
                    $( $text => $name::$variant, )+
                    other => $name::Other(other.to_string()),
                }
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                $name::from(s.as_str())
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                String::deserialize(d).map($name::from)
            }
        }
    };
}

pub(crate) use string_enum;

#[cfg(test)]
mod tests {
    string_enum! {
        pub enum Colour {
            Red = "red",
            DarkBlue = "dark-blue",
        }
    }

    #[test]
    fn known_and_unknown_strings_round_trip() {
        assert_eq!(Colour::from("dark-blue"), Colour::DarkBlue);
        assert_eq!(Colour::from("mauve"), Colour::Other("mauve".into()));
        for c in [Colour::Red, Colour::DarkBlue, Colour::Other("mauve".into())] {
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{c}\""));
            assert_eq!(serde_json::from_str::<Colour>(&json).unwrap(), c);
        }
    }
}
