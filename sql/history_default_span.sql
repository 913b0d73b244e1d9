-- The newest dispatched_at in the history table's DEFAULT partition (NULL when
-- it is empty, as it is unless a move found no partition). A new partition
-- must start after it: attaching one whose range holds a row of the DEFAULT
-- partition fails. The DEFAULT partition has no index; it is read whole, and
-- is normally empty.
SELECT max(dispatched_at) FROM {{history_default}}
