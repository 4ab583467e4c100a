//! The paper's cost model: every storage transaction is billed, a get that returns nothing
//! included. Turns transaction counts and rates into US dollars, at the price of the queue's
//! backend ([`Billing`]): the configured `price_per_10k_transactions` for Azure and the
//! embedded queue, SQS's list price per request for SQS.
//!
//! Attempts that got no answer (a broken connection, no answer in time) are not known to be
//! billed: they are priced apart, as how much more the bill may be at most.

use serde::{Deserialize, Serialize};

use crate::queue::TransactionRates;

/// The whitepaper's price: US$0.01 per 10,000 storage transactions.
pub const PAPER_PRICE_PER_10K: f64 = crate::defaults::PRICE_PER_10K_TRANSACTIONS;

/// SQS's price for a standard queue: US$0.40 per million requests ($0.004 per 10,000). A
/// request is a call, and each 64 KiB of a payload; the first million a month are free
/// (AWS's free tier), which the figures do not take off.
pub const SQS_STANDARD_PRICE_PER_10K: f64 = 0.004;

/// SQS's price for a FIFO queue: US$0.50 per million requests.
pub const SQS_FIFO_PRICE_PER_10K: f64 = 0.005;

/// S3 Standard's price of a PUT, COPY, POST or LIST request: US$0.005 per 1,000.
pub const S3_PUT_PRICE_PER_10K: f64 = 0.05;

/// S3 Standard's price of a GET (and any other request but a DELETE, which is free):
/// US$0.0004 per 1,000.
pub const S3_GET_PRICE_PER_10K: f64 = 0.004;

/// What S3 bills for `puts` PUT-class and `gets` GET-class requests (claim checks' bodies).
pub fn s3_usd(puts: u64, gets: u64) -> f64 {
    usd(puts as f64, S3_PUT_PRICE_PER_10K) + usd(gets as f64, S3_GET_PRICE_PER_10K)
}

/// How a queue's backend bills its transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Billing {
    /// At the configured `price_per_10k_transactions` (Azure, the embedded queue).
    Configured,
    /// An SQS standard queue: [`SQS_STANDARD_PRICE_PER_10K`].
    SqsStandard,
    /// An SQS FIFO queue (its `queue_url` ends in `.fifo`; an ebb queue's name has no dot): [`SQS_FIFO_PRICE_PER_10K`].
    SqsFifo,
}

impl Billing {
    /// The price in US dollars per 10,000 transactions, `configured` being the host's
    /// `price_per_10k_transactions`.
    pub fn price_per_10k(self, configured: f64) -> f64 {
        match self {
            Billing::Configured => configured,
            Billing::SqsStandard => SQS_STANDARD_PRICE_PER_10K,
            Billing::SqsFifo => SQS_FIFO_PRICE_PER_10K,
        }
    }
}

/// The paper's month: 30 days (its $2.38 = 79,200 / 10,000 × $0.01 × 30 days).
pub const HOURS_PER_MONTH: f64 = 30.0 * 24.0;

/// What `transactions` cost at `price_per_10k` US dollars per 10,000.
pub fn usd(transactions: f64, price_per_10k: f64) -> f64 {
    transactions / 10_000.0 * price_per_10k
}

/// What a steady `per_hour` rate costs in a (30-day) month.
pub fn usd_per_month(per_hour: f64, price_per_10k: f64) -> f64 {
    usd(per_hour * HOURS_PER_MONTH, price_per_10k)
}

/// Live cost figures of a queue (or of the whole host): the recent transaction rates and
/// what a month at those rates would cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CostStatus {
    /// The price used, in US dollars per 10,000 transactions.
    pub price_per_10k_transactions: f64,
    /// The time the rates are taken over, in seconds (the last 10 minutes, or since start).
    pub window_secs: f64,
    /// Every billed transaction, per hour.
    pub transactions_per_hour: f64,
    /// Idle transactions (empty gets, and counts that found the queue empty), per hour.
    pub idle_transactions_per_hour: f64,
    /// A month at the current rate of all transactions, in US dollars.
    pub usd_per_month: f64,
    /// Of that, the idle transactions' part: what doing nothing costs at this rate.
    pub idle_usd_per_month: f64,
    /// Attempts that got no answer, per hour: not in `transactions_per_hour`; the service
    /// may or may not have billed them.
    pub unanswered_transactions_per_hour: f64,
    /// What a month at the rate of unanswered attempts would add at most, in US dollars: the
    /// bill is between `usd_per_month` and that much more.
    pub unanswered_usd_per_month: f64,
}

impl CostStatus {
    /// The figures for `rates` at `price_per_10k`.
    pub fn new(rates: TransactionRates, price_per_10k: f64) -> CostStatus {
        CostStatus {
            price_per_10k_transactions: price_per_10k,
            window_secs: rates.window_secs,
            transactions_per_hour: rates.all_per_hour,
            idle_transactions_per_hour: rates.idle_per_hour,
            usd_per_month: usd_per_month(rates.all_per_hour, price_per_10k),
            idle_usd_per_month: usd_per_month(rates.idle_per_hour, price_per_10k),
            unanswered_transactions_per_hour: rates.unanswered_per_hour,
            unanswered_usd_per_month: usd_per_month(rates.unanswered_per_hour, price_per_10k),
        }
    }

    /// The sum of several queues' figures (the window is the longest of theirs).
    pub fn total<'a>(parts: impl IntoIterator<Item = &'a CostStatus>, price_per_10k: f64) -> CostStatus {
        parts.into_iter().fold(CostStatus { price_per_10k_transactions: price_per_10k, ..CostStatus::default() }, |sum, part| CostStatus {
            price_per_10k_transactions: price_per_10k,
            window_secs: sum.window_secs.max(part.window_secs),
            transactions_per_hour: sum.transactions_per_hour + part.transactions_per_hour,
            idle_transactions_per_hour: sum.idle_transactions_per_hour + part.idle_transactions_per_hour,
            usd_per_month: sum.usd_per_month + part.usd_per_month,
            idle_usd_per_month: sum.idle_usd_per_month + part.idle_usd_per_month,
            unanswered_transactions_per_hour: sum.unanswered_transactions_per_hour + part.unanswered_transactions_per_hour,
            unanswered_usd_per_month: sum.unanswered_usd_per_month + part.unanswered_usd_per_month,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_papers_idle_thread_costs_two_dollars_thirty_eight_a_month() {
        // 22 idle hours a day at one get per second.
        let per_day = 22.0 * 3600.0;
        assert_eq!(per_day, 79_200.0);
        let per_month = usd(per_day * 30.0, PAPER_PRICE_PER_10K);
        assert!((per_month - 2.376).abs() < 1e-9, "{per_month}");
        assert_eq!(format!("{per_month:.2}"), "2.38");
    }

    #[test]
    fn s3_bills_a_thousand_puts_half_a_cent_and_a_thousand_gets_four_hundredths() {
        assert!((s3_usd(1000, 0) - 0.005).abs() < 1e-12 && (s3_usd(0, 1000) - 0.0004).abs() < 1e-12);
    }

    #[test]
    fn a_steady_rate_is_projected_over_thirty_days() {
        let rates = TransactionRates { window_secs: 600.0, all_per_hour: 3600.0, idle_per_hour: 60.0, unanswered_per_hour: 36.0 };
        let cost = CostStatus::new(rates, 0.01);
        assert!((cost.usd_per_month - 2.592).abs() < 1e-9, "{cost:?}");
        assert!((cost.idle_usd_per_month - 0.0432).abs() < 1e-9, "{cost:?}");
        assert!((cost.unanswered_usd_per_month - 0.02592).abs() < 1e-9, "at most this much more: {cost:?}");
        let total = CostStatus::total([&cost, &cost], 0.01);
        assert!((total.usd_per_month - 5.184).abs() < 1e-9 && total.window_secs == 600.0, "{total:?}");
        assert!((total.unanswered_transactions_per_hour - 72.0).abs() < 1e-9, "{total:?}");
    }
}
