impl super::CursorDeletionState {}
