//! Protection domains: which exist, and how many objects (regions, QPs,
//! SRQs) use each, so that one in use is not deallocated. The control
//! plane's alone: the shards see only each region's PD, in the
//! [`super::MemoryTable`] snapshot they hold, which a new QP therefore
//! need not copy.

use super::PdId;
use crate::error::{Result, VerbsError};

#[derive(Debug, Default)]
pub struct ProtectionDomains {
    /// Objects that use each PD; `None` once deallocated.
    users: Vec<Option<u32>>,
}

impl ProtectionDomains {
    pub fn alloc(&mut self) -> PdId {
        self.users.push(Some(0));
        PdId(self.users.len() as u32 - 1)
    }

    pub fn dealloc(&mut self, pd: PdId) -> Result<()> {
        match self.users.get_mut(pd.0 as usize) {
            Some(slot @ Some(0)) => {
                *slot = None;
                Ok(())
            }
            Some(Some(_)) => Err(VerbsError::Busy("protection domain")),
            _ => Err(VerbsError::NotFound("protection domain")),
        }
    }

    pub fn exists(&self, pd: PdId) -> bool {
        matches!(self.users.get(pd.0 as usize), Some(Some(_)))
    }

    /// Fails unless `pd` exists.
    pub fn check(&self, pd: PdId) -> Result<()> {
        match self.exists(pd) {
            true => Ok(()),
            false => Err(VerbsError::NotFound("protection domain")),
        }
    }

    /// Records that one more object uses `pd` (or one fewer).
    pub fn add_users(&mut self, pd: PdId, delta: i32) -> Result<()> {
        match self.users.get_mut(pd.0 as usize) {
            Some(Some(users)) => {
                *users = users.checked_add_signed(delta).expect("pd user count");
                Ok(())
            }
            _ => Err(VerbsError::NotFound("protection domain")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pd_in_use_is_not_deallocated() {
        let mut pds = ProtectionDomains::default();
        let pd = pds.alloc();
        pds.add_users(pd, 1).unwrap();
        assert_eq!(pds.dealloc(pd), Err(VerbsError::Busy("protection domain")));
        pds.add_users(pd, -1).unwrap();
        pds.dealloc(pd).unwrap();
        assert!(!pds.exists(pd));
        assert_eq!(pds.check(pd), Err(VerbsError::NotFound("protection domain")));
        assert_eq!(pds.dealloc(pd), Err(VerbsError::NotFound("protection domain")));
        assert_eq!(pds.add_users(PdId(9), 1), Err(VerbsError::NotFound("protection domain")));
    }
}
