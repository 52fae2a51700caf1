-- Admission of new turns to the broker's queue of new turns, shared fairly between tenants.
-- Read the docstring of `store.redis_admission` first.
--
-- One script for every decision: each one changes a turn's place (ARGV[1]) and then runs the
-- same admission pass, which sends waiting turns on while the window has room.
--
-- KEYS[1]  state key: hash {vtime}, the start tag of the last turn admitted
-- KEYS[2]  tenants key: sorted set, tenant with turns waiting -> the start tag of its next turn
-- KEYS[3]  lanes key: hash, tenant -> the finish tag of its last admitted turn
-- KEYS[4]  slots key: sorted set, admitted turn not yet started -> expiry of its slot (ms)
-- KEYS[5]  turns key: hash, every turn known here -> "w:<tenant>" (waiting), "s:<tenant>"
--          (admitted, in a slot) or "r:<tenant>" (started, in flight)
-- KEYS[6]  the base of the per-tenant keys, all in the same hash slot as KEYS[1..5]:
--          <base>:waiting:<tenant> (list of turn ids, oldest first) and
--          <base>:active:<tenant> (sorted set: admitted or started turn -> expiry in ms)
-- ARGV[1]  operation: 'enqueue' (the turn waits its turn), 'start' (a worker took its first
--          step), 'release' (it ended, waits for a person or will not run), 'pump' (admission pass
--          only), 'lined-up' (which of the turns in ARGV[2] wait or hold a slot: returns their ids,
--          after giving back expired slots, and admits nothing)
-- ARGV[2]  turn id ('' for pump; ids separated by spaces for lined-up), ARGV[3] its tenant ('' for none)
-- ARGV[4]  now in ms ('' for the server clock, which every process shares)
-- ARGV[5]  window: most admitted turns not yet started, all tenants together
-- ARGV[6]  most active turns of one tenant (0: no cap)
-- ARGV[7]  slot lease in ms (an admitted turn that never starts gives its slot back after it)
-- ARGV[8]  active lease in ms (a started turn that never reports its end stops counting after it)
-- ARGV[9]  tenant weights as a JSON object (a tenant not named weighs 1)
--
-- Returns {place, tenant waiting, tenant active, tenant, admitted id...}: place is the turn's
-- place in its tenant's line (1 = next; 0 = not waiting), the counts are those of the tenant
-- after the pass (ARGV[3], or the released turn's own), and the ids are the turns admitted by
-- this call, for the caller to send.
--
-- Writes: every key above; none expires (waiting turns must not vanish): they empty themselves
-- as turns start and end, and the leases bound what a crashed caller leaves behind. The tags are
-- kept when nobody waits: a tenant whose turns were admitted a moment ago still goes after a
-- newcomer. KEYS[3] holds one field per tenant ever seen.

-- include: _clock
local now = now_ms(ARGV[4])
local op, turn, tenant = ARGV[1], ARGV[2], ARGV[3]
local window, cap = tonumber(ARGV[5]), tonumber(ARGV[6])
local slot_ms, active_ms = tonumber(ARGV[7]), tonumber(ARGV[8])
local weights = cjson.decode(ARGV[9])
local state, tenants, lanes, slots, turns = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local base = KEYS[6]

local function exact(x)
    return string.format('%.17g', x)
end

local function waiting_key(t)
    return base .. ':waiting:' .. t
end

local function active_key(t)
    return base .. ':active:' .. t
end

local function weight(t)
    local w = tonumber(weights[t])
    if w == nil or w <= 0 then
        return 1
    end
    return w
end

local function active_count(t)
    -- Entries past their lease belong to turns whose end was never reported (a crash): forget them.
    local gone = redis.call('ZRANGEBYSCORE', active_key(t), '-inf', exact(now))
    for _, id in ipairs(gone) do
        redis.call('ZREM', active_key(t), id)
        if redis.call('HGET', turns, id) == 'r:' .. t then
            redis.call('HDEL', turns, id)
        end
    end
    return redis.call('ZCARD', active_key(t))
end

local function forget(id, known)
    -- Drop an admitted or started turn from the slots and its tenant's active set.
    local t = string.sub(known, 3)
    redis.call('ZREM', slots, id)
    redis.call('ZREM', active_key(t), id)
    redis.call('HDEL', turns, id)
end

local function line_up(t)
    -- A tenant that starts waiting starts at the virtual time, or after its own last turn if later,
    -- so a newcomer is never queued behind another tenant's crowd.
    if redis.call('ZSCORE', tenants, t) == false then
        local vtime = tonumber(redis.call('HGET', state, 'vtime')) or 0
        local last = tonumber(redis.call('HGET', lanes, t)) or 0
        redis.call('ZADD', tenants, exact(math.max(vtime, last)), t)
    end
end

-- Slots of admitted turns that never started (their message was lost, or their worker died
-- before the first step) are given back.
for _, id in ipairs(redis.call('ZRANGEBYSCORE', slots, '-inf', exact(now))) do
    local known = redis.call('HGET', turns, id)
    if known and string.sub(known, 1, 2) == 's:' then
        forget(id, known)
    else
        redis.call('ZREM', slots, id)
    end
end

if op == 'lined-up' then
    -- Read only: which of the turns (ARGV[2], separated by spaces) wait or hold a slot.
    local found = {}
    for id in string.gmatch(turn, '%S+') do
        local state = redis.call('HGET', turns, id)
        if state and (string.sub(state, 1, 2) == 'w:' or string.sub(state, 1, 2) == 's:') then
            found[#found + 1] = id
        end
    end
    return found
end

local known = false
if turn ~= '' then
    known = redis.call('HGET', turns, turn)
end
if op == 'enqueue' then
    if known and string.sub(known, 1, 2) == 'r:' then
        -- Known as started, yet it is READY at its first version again: its worker died before
        -- saving. It waits again like a new turn.
        forget(turn, known)
        known = false
    end
    if not known then
        redis.call('RPUSH', waiting_key(tenant), turn)
        redis.call('HSET', turns, turn, 'w:' .. tenant)
        line_up(tenant)
    end
elseif op == 'start' then
    if known and string.sub(known, 1, 2) == 'w:' then
        -- Started without being admitted (a message sent while admission could not be reached):
        -- it leaves its line.
        local t = string.sub(known, 3)
        redis.call('LREM', waiting_key(t), 0, turn)
        if redis.call('LLEN', waiting_key(t)) == 0 then
            redis.call('ZREM', tenants, t)
        end
    end
    redis.call('ZREM', slots, turn)
    redis.call('ZADD', active_key(tenant), exact(now + active_ms), turn)
    redis.call('HSET', turns, turn, 'r:' .. tenant)
elseif op == 'release' then
    if known and string.sub(known, 1, 2) == 'w:' then
        local t = string.sub(known, 3)
        redis.call('LREM', waiting_key(t), 0, turn)
        redis.call('HDEL', turns, turn)
        if redis.call('LLEN', waiting_key(t)) == 0 then
            redis.call('ZREM', tenants, t)
        end
    elseif known then
        forget(turn, known)
    end
end

-- The admission pass: while the window has room, the waiting tenant under the cap with the
-- fewest active turns for its weight sends its oldest turn (the workers are shared by what each
-- tenant holds now, so a tenant that arrives beside a flood is let in until it holds its share);
-- among equals, the smallest start tag goes first, and its next turn is tagged 1 / weight later
-- (start-time fair queueing).
local admitted = {}
local free = window - redis.call('ZCARD', slots)
while free > 0 do
    local pick, tag, least = nil, nil, nil
    local order = redis.call('ZRANGE', tenants, 0, -1, 'WITHSCORES')
    for i = 1, #order, 2 do
        local active = active_count(order[i])
        if cap <= 0 or active < cap then
            local share = active / weight(order[i])
            if least == nil or share < least then
                pick, tag, least = order[i], tonumber(order[i + 1]), share
            end
        end
    end
    if pick == nil then
        break
    end
    local id = redis.call('LPOP', waiting_key(pick))
    if id and redis.call('HGET', turns, id) == 'w:' .. pick then
        redis.call('ZADD', slots, exact(now + slot_ms), id)
        redis.call('ZADD', active_key(pick), exact(now + active_ms), id)
        redis.call('HSET', turns, id, 's:' .. pick)
        admitted[#admitted + 1] = id
        free = free - 1
        local finish = tag + 1 / weight(pick)
        redis.call('HSET', state, 'vtime', exact(tag))
        redis.call('HSET', lanes, pick, exact(finish))
        tag = finish
    end
    if redis.call('LLEN', waiting_key(pick)) > 0 then
        redis.call('ZADD', tenants, exact(tag), pick)
    else
        redis.call('ZREM', tenants, pick)
    end
end

if op == 'release' and known then
    tenant = string.sub(known, 3) -- the counts reported are those of the released turn's tenant
end
local place = 0
if turn ~= '' and redis.call('HGET', turns, turn) == 'w:' .. tenant then
    place = (redis.call('LPOS', waiting_key(tenant), turn) or 0) + 1
end
local reply = {place, redis.call('LLEN', waiting_key(tenant)), active_count(tenant), tenant}
for _, id in ipairs(admitted) do
    reply[#reply + 1] = id
end
return reply
