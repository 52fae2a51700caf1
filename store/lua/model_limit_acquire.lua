-- Grant one model call against a shared limit, or book it the next free slot.
-- The decision mirrors `agent_runner.model_limits.decide`; read its module docstring first.
--
-- KEYS[1]  state key (RedisKeys.model_limit[0]): hash {rpm_tat, tpm_tat, paused_until}, times in ms
-- KEYS[2]  calls key (RedisKeys.model_limit[1]): sorted set, reservation id scored by the expiry of its slot
-- KEYS[3]  bookings key (RedisKeys.model_limit[2]): sorted set, booking id scored by its slot time
-- KEYS[4]  tags key (RedisKeys.model_limit[3]): sorted set, booking id scored by its place in the fair order
-- KEYS[5]  lanes key (RedisKeys.model_limit[4]): hash, tenant -> the tag of its last booking
-- ARGV[1]  reservation id of this call (also the booking id if it is booked)
-- ARGV[2]  tokens reserved (estimated input plus the output allowance)
-- ARGV[3]  the limit, seven numbers separated by spaces (one argument, encoded once per key):
--          rpm, tpm, concurrency (0: that dimension is not limited), burst (requests at once
--          after a quiet spell), call lease in ms, booking grace in ms, concurrency poll in ms
-- ARGV[4]  booking id the caller holds ('' for none)
-- ARGV[5]  now in ms ('' for the server clock, which every process shares)
-- ARGV[6]  the caller's tenant ('' for none), ARGV[7] its weight
--
-- Returns {1, now, '', '', now} when granted, else {0, until_ms, reason, booking id or '', now}: the
-- caller measures the wait against `now`, so a difference between its clock and the server's
-- does not move it.
--
-- Writes: KEYS[1] (HSET), KEYS[2] (ZREMRANGEBYSCORE, ZADD), KEYS[3] and KEYS[4] (ZREM, ZADD),
-- KEYS[5] (HSET, DEL); all five PEXPIRE a minute plus the lease and grace after the furthest
-- time they hold, so an idle limit leaves nothing behind.

-- include: _clock
local now = now_ms(ARGV[5])
local id, tokens = ARGV[1], tonumber(ARGV[2])
local limit = {}
for number in string.gmatch(ARGV[3], '%S+') do
    limit[#limit + 1] = tonumber(number)
end
local rpm, tpm, concurrency, burst = limit[1], limit[2], limit[3], limit[4]
local lease, grace, poll = limit[5], limit[6], limit[7]
local booking = ARGV[4]
local tenant, weight = ARGV[6], tonumber(ARGV[7])
local PERIOD = 60000

local function ms(x)
    return string.format('%.3f', x)
end

-- Tags are kept to the last bit, so both limiters order equal tags alike.
local function exact(x)
    return string.format('%.17g', x)
end

local state = redis.call('HMGET', KEYS[1], 'rpm_tat', 'tpm_tat', 'paused_until', 'vtime')
local rpm_tat, tpm_tat, paused = tonumber(state[1]) or 0, tonumber(state[2]) or 0, tonumber(state[3]) or 0
local vtime = tonumber(state[4]) or 0
local furthest = 0

local function keep()
    local ttl = math.ceil(math.max(rpm_tat, tpm_tat, paused, furthest, now) - now + lease + grace + PERIOD)
    for i = 1, 5 do
        redis.call('PEXPIRE', KEYS[i], ttl)
    end
end

-- Expired slots (a crashed caller's) and bookings past their grace are dropped first.
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ms(now))
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ms(now - grace))
for _, gone in ipairs(expired) do
    redis.call('ZREM', KEYS[3], gone)
    redis.call('ZREM', KEYS[4], gone)
end
if redis.call('ZCARD', KEYS[3]) == 0 then
    redis.call('DEL', KEYS[5]) -- nobody waits: every tenant starts again from the virtual time
end
local held = ''
if booking ~= '' and redis.call('ZSCORE', KEYS[3], booking) then
    held = booking
end

if concurrency > 0 and redis.call('ZCARD', KEYS[2]) >= concurrency then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    return {0, ms(math.min(tonumber(first[2]), now + poll)), 'concurrency', held, ms(now)}
end

local interval = 0
if rpm > 0 then
    interval = PERIOD / rpm
end
if held ~= '' then
    local slot = tonumber(redis.call('ZSCORE', KEYS[3], held))
    if slot > now then
        return {0, ms(slot), 'slot', held, ms(now)}
    end
    if paused > now then
        return {0, ms(paused), 'paused', held, ms(now)}
    end
    -- The rate is checked again on the real send time: a caller that came back late must
    -- not crowd the one that follows it.
    if rpm > 0 then
        local allowed = math.max(rpm_tat, now) - (burst - 1) * interval
        if allowed > now then
            return {0, ms(allowed), 'slot', held, ms(now)}
        end
    end
    redis.call('ZREM', KEYS[3], held)
    local tag = tonumber(redis.call('ZSCORE', KEYS[4], held)) or 0
    redis.call('ZREM', KEYS[4], held)
    if tag > vtime then
        redis.call('HSET', KEYS[1], 'vtime', exact(tag))
    end
else
    local tag = math.max(vtime, tonumber(redis.call('HGET', KEYS[5], tenant)) or 0) + 1 / weight
    local behind = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. exact(tag), '+inf')
    local slot, reason = now, ''
    if paused > slot then
        slot, reason = paused, 'paused'
    end
    -- Start-time fair queueing: a booking whose tag comes before waiting ones takes the slot of
    -- the first of them, and they move one interval later; else it goes after the last one.
    local queued = nil
    for _, other in ipairs(behind) do
        local at = tonumber(redis.call('ZSCORE', KEYS[3], other))
        if queued == nil or at < queued then
            queued = at
        end
    end
    if queued == nil then
        local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
        if last[2] then
            queued = tonumber(last[2]) + interval
        end
    end
    if queued ~= nil and queued > slot then
        slot = queued
        if rpm > 0 then
            reason = 'rpm'
        else
            reason = 'tpm'
        end
    end
    if rpm > 0 then
        local allowed = math.max(rpm_tat, now) - (burst - 1) * interval
        if allowed > slot then
            slot, reason = allowed, 'rpm'
        end
    end
    if tpm > 0 then
        local per_token = PERIOD / tpm
        local start = math.max(tpm_tat, now)
        local allowed = start + (tokens - tpm / 6) * per_token
        tpm_tat = start + tokens * per_token
        redis.call('HSET', KEYS[1], 'tpm_tat', ms(tpm_tat))
        if allowed > slot then
            slot, reason = allowed, 'tpm'
        end
    end
    if reason ~= '' then
        for _, other in ipairs(behind) do
            local at = tonumber(redis.call('ZSCORE', KEYS[3], other))
            if at >= slot then
                redis.call('ZADD', KEYS[3], ms(at + interval), other)
                furthest = math.max(furthest, at + interval)
            end
        end
        furthest = math.max(furthest, slot)
        redis.call('ZADD', KEYS[3], ms(slot), id)
        redis.call('ZADD', KEYS[4], exact(tag), id)
        redis.call('HSET', KEYS[5], tenant, exact(tag))
        keep()
        return {0, ms(slot), reason, id, ms(now)}
    end
end
if rpm > 0 then
    rpm_tat = math.max(rpm_tat, now) + interval
    redis.call('HSET', KEYS[1], 'rpm_tat', ms(rpm_tat))
end
if concurrency > 0 then
    redis.call('ZADD', KEYS[2], ms(now + lease), id)
end
keep()
return {1, ms(now), '', '', ms(now)}
