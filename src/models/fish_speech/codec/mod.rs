//! The modified DAC codec (filled in below).
