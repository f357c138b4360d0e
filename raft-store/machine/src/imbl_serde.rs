//! Serde for the persistent collections the machine keeps, used field by field with
//! `#[serde(with = "...")]` (imbl's own `serde` feature stays off).
//!
//! imbl's visitors reserve as many elements as the input's length prefix declares, and bincode
//! passes that prefix on unchecked: a snapshot or a batch with a forged length made the decoder
//! ask for hundreds of gigabytes and abort the process. These visitors reserve nothing; they
//! insert element by element, so a forged length ends in an error when the input runs out. The
//! encoding is the one imbl writes (a map with its length, a sequence with its length), so data
//! written before stays readable.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub(crate) mod ord_map {
    use super::*;
    use imbl::OrdMap;

    pub(crate) fn serialize<K, V, S>(map: &OrdMap<K, V>, serializer: S) -> Result<S::Ok, S::Error>
    where
        K: Serialize + Ord + Clone,
        V: Serialize + Clone,
        S: Serializer,
    {
        let mut out = serializer.serialize_map(Some(map.len()))?;
        for (key, value) in map {
            out.serialize_entry(key, value)?;
        }
        out.end()
    }

    pub(crate) fn deserialize<'de, K, V, D>(deserializer: D) -> Result<OrdMap<K, V>, D::Error>
    where
        K: Deserialize<'de> + Ord + Clone,
        V: Deserialize<'de> + Clone,
        D: Deserializer<'de>,
    {
        struct Entries<K, V>(PhantomData<(K, V)>);

        impl<'de, K, V> Visitor<'de> for Entries<K, V>
        where
            K: Deserialize<'de> + Ord + Clone,
            V: Deserialize<'de> + Clone,
        {
            type Value = OrdMap<K, V>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut map = OrdMap::new();
                while let Some((key, value)) = access.next_entry()? {
                    map.insert(key, value);
                }
                Ok(map)
            }
        }

        deserializer.deserialize_map(Entries(PhantomData))
    }
}

pub(crate) mod vector {
    use super::*;
    use imbl::Vector;

    pub(crate) fn serialize<T, S>(items: &Vector<T>, serializer: S) -> Result<S::Ok, S::Error>
    where
        T: Serialize + Clone,
        S: Serializer,
    {
        let mut out = serializer.serialize_seq(Some(items.len()))?;
        for item in items {
            out.serialize_element(item)?;
        }
        out.end()
    }

    pub(crate) fn deserialize<'de, T, D>(deserializer: D) -> Result<Vector<T>, D::Error>
    where
        T: Deserialize<'de> + Clone,
        D: Deserializer<'de>,
    {
        struct Items<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de> + Clone> Visitor<'de> for Items<T> {
            type Value = Vector<T>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a sequence")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut items = Vector::new();
                while let Some(item) = access.next_element()? {
                    items.push_back(item);
                }
                Ok(items)
            }
        }

        deserializer.deserialize_seq(Items(PhantomData))
    }
}
