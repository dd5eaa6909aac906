//! UCI's 8x8 handwritten digits (1797 samples, shipped inside the
//! `smartcore` crate: no download), split into training and held-out
//! samples by a seeded shuffle, pixels standardised on the training set.

pub const FEATURES: usize = 64;
pub const CLASSES: usize = 10;
const TEST_SHARE: f64 = 0.2;

/// splitmix64, for reproducible shuffles and initial weights.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, (self.next() % (i as u64 + 1)) as usize);
        }
    }
}

pub struct Data {
    pub train_x: Vec<f32>,
    pub train_y: Vec<f32>,
    pub test_x: Vec<f32>,
    pub test_y: Vec<f32>,
}

impl Data {
    pub fn load(seed: u64) -> Self {
        let digits = smartcore::dataset::digits::load_dataset();
        let (f, n) = (digits.num_features, digits.num_samples);
        assert_eq!(f, FEATURES);
        let mut order: Vec<usize> = (0..n).collect();
        Rng(seed).shuffle(&mut order);
        let (test, train) = order.split_at((n as f64 * TEST_SHARE).round() as usize);
        let rows = |ids: &[usize]| -> Vec<f32> {
            ids.iter()
                .flat_map(|&i| &digits.data[i * f..][..f])
                .copied()
                .collect()
        };
        let (mut train_x, mut test_x) = (rows(train), rows(test));
        for j in 0..f {
            let col = || train_x.iter().skip(j).step_by(f);
            let mean = col().sum::<f32>() / train.len() as f32;
            let var = col().map(|v| (v - mean) * (v - mean)).sum::<f32>() / train.len() as f32;
            let scale = if var > 0.0 { 1.0 / var.sqrt() } else { 1.0 };
            for v in train_x.iter_mut().chain(&mut test_x).skip(j).step_by(f) {
                *v = (*v - mean) * scale;
            }
        }
        let labels = |ids: &[usize]| ids.iter().map(|&i| digits.target[i]).collect();
        Data {
            train_x,
            train_y: labels(train),
            test_x,
            test_y: labels(test),
        }
    }

    /// Batch `b` of an epoch's `order`: features and labels.
    pub fn batch(&self, order: &[usize], b: usize, rows: usize) -> Vec<Vec<f32>> {
        let ids = &order[b * rows..][..rows];
        let x = ids
            .iter()
            .flat_map(|&i| &self.train_x[i * FEATURES..][..FEATURES])
            .copied()
            .collect();
        vec![x, ids.iter().map(|&i| self.train_y[i]).collect()]
    }
}
