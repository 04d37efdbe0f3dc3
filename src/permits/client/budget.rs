//! The command-local permit budget (claim / restore / drain).

/// Errors of [`CommandBudget`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// `claim` with nothing left: the command carried more messages than P.
    #[error("budget of {permits} permits exhausted")]
    Exhausted {
        /// P of the command.
        permits: u32,
    },
    /// `restore` without a matching claim.
    #[error("restore without a matching claim (budget {permits})")]
    NothingClaimed {
        /// P of the command.
        permits: u32,
    },
}

/// The command-local budget of P permits during batch expansion.
///
/// Each message handed off to the application **claims** one unit (and
/// will return it itself when dequeued); a failed hand-off **restores** it;
/// skipped and unexpanded indexes claim nothing. [`CommandBudget::drain`]
/// consumes the budget and yields what the command itself must return, so
/// `claimed + drained = P` and nothing is returned twice.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a command budget must be drained, or its permits leak"]
pub struct CommandBudget {
    permits: u32,
    remaining: u32,
}

impl CommandBudget {
    /// A budget of `permits` (P), nothing claimed.
    pub fn new(permits: u32) -> Self {
        Self {
            permits,
            remaining: permits,
        }
    }

    /// P.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Units not claimed.
    pub fn remaining(&self) -> u32 {
        self.remaining
    }

    /// Units claimed (messages handed off).
    pub fn claimed(&self) -> u32 {
        self.permits - self.remaining
    }

    /// Claims one unit for a handed-off message.
    ///
    /// # Errors
    /// [`BudgetError::Exhausted`]; the budget is unchanged.
    pub fn claim(&mut self) -> Result<(), BudgetError> {
        if self.remaining == 0 {
            return Err(BudgetError::Exhausted {
                permits: self.permits,
            });
        }
        self.remaining -= 1;
        Ok(())
    }

    /// Gives back one claimed unit (the hand-off failed).
    ///
    /// # Errors
    /// [`BudgetError::NothingClaimed`]; the budget is unchanged.
    pub fn restore(&mut self) -> Result<(), BudgetError> {
        if self.remaining == self.permits {
            return Err(BudgetError::NothingClaimed {
                permits: self.permits,
            });
        }
        self.remaining += 1;
        Ok(())
    }

    /// Ends the command: returns the unclaimed units (the command's own
    /// return). Consumes the budget, so it cannot be drained twice.
    pub fn drain(self) -> u32 {
        self.remaining
    }
}
