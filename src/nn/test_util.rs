//! Helpers of the layers' unit tests.

use candle_core::Tensor;

/// The largest `|a - b|` over two f32 tensors of the same shape.
pub(crate) fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}
