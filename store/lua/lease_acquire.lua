-- Take a turn's lease if nobody else holds it, and hand out the next fencing number.
--
-- KEYS[1]  lease key (RedisKeys.turn_lease): hash {owner, fence}, expires with the lease
-- KEYS[2]  fence key (RedisKeys.turn_fence): integer counter, expires ARGV[3] ms after the last acquire
-- ARGV[1]  owner token of the caller
-- ARGV[2]  time to live of the lease in milliseconds (a positive integer)
-- ARGV[3]  time to live of the fence counter in milliseconds (at least ARGV[2])
--
-- Returns the new fencing number, or nil when another owner holds an unexpired lease.
--
-- Writes: KEYS[1] (HSET, PEXPIRE), KEYS[2] (SET when missing, INCR, PEXPIRE).
--
-- An expired lease is simply absent: Redis drops the hash at its PX deadline, so "free"
-- and "expired" are the same case here. The counter lives in its own key, with a TTL
-- far longer than any lease, because the lease hash disappears on expiry; a fence kept
-- inside it would restart at 1 and a worker woken from a long pause could not be told
-- apart from the new holder. The same owner acquiring again gets a fresh fence too,
-- which retires its older Lease.
-- A missing counter is seeded from the server clock in microseconds rather than 0: if
-- Redis lost its data, fences handed out afterwards still exceed every fence the SQL
-- store has already seen for the turn, so saves are not refused as stale. The same
-- argument makes the counter's expiry safe: every earlier fence is its seed plus one per
-- acquire, and acquires come far less often than once a microsecond, so it stays below
-- the clock of its last acquire, which the new seed exceeds by at least the counter's TTL.
-- Expiry only keeps the counters of finished turns from piling up.

local holder = redis.call('HGET', KEYS[1], 'owner')
if holder and holder ~= ARGV[1] then
    return false
end

if redis.call('EXISTS', KEYS[2]) == 0 then
    local now = redis.call('TIME')
    redis.call('SET', KEYS[2], tonumber(now[1]) * 1000000 + tonumber(now[2]))
end
local fence = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'fence', fence)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return fence
