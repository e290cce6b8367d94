"""The Lua scripts that count reports in Redis, each applied whole or not at all: an actor's report
(what its session's totals add, on a secure run no further than the learners' deliveries) and a
learner's deliveries (what its process's totals add). Each counts a report once however often it
comes. They name no key: `RunStore` (coordinator/store.py, the only module that does) passes them
in as KEYS.
"""

# KEYS: actors, status, member_steps, the member's returns, reports, the actor's tally.
# ARGV: actor, now, member, env steps, session, session's env steps, session's episodes, returns kept,
# checked ('1': count no more than the learners say they took), the returns (oldest first: the last
# of them are the session's newest episodes; '-': an episode counted whose return the member's
# record does not take).
# Returns: env steps and episodes counted, the run's env steps, the member's recent returns if any
# were pushed, the episodes claimed but not counted yet (whose returns the actor sends again), and
# the env steps claimed but not counted yet.
ADD_REPORT = """
local actor, session = ARGV[1], ARGV[5]
local returns = #ARGV - 9
local steps, episodes = tonumber(ARGV[4]), returns
if session ~= '0' then
  local heard_steps, heard_episodes = 0, 0
  local last = redis.call('HGET', KEYS[5], actor)
  if last then
    local last_session, s, e = string.match(last, '^(%d+):(%d+):(%d+)$')
    if last_session == session then
      heard_steps, heard_episodes = tonumber(s), tonumber(e)
    end
  end
  local total_steps, total_episodes = tonumber(ARGV[6]), tonumber(ARGV[7])
  steps = math.max(total_steps - heard_steps, 0)
  episodes = math.max(total_episodes - heard_episodes, 0)
  redis.call('HSET', KEYS[5], actor, session .. ':' .. math.max(total_steps, heard_steps) .. ':'
             .. math.max(total_episodes, heard_episodes))
end
-- Episodes claimed and not counted before this report, oldest first: they end with its newest.
local pending, steps_uncounted = episodes, 0
if ARGV[9] == '1' then
  -- The name's claims add up over its sessions; what counts is what its deliveries cover.
  local function due(kind, claimed)
    local claims = redis.call('HINCRBY', KEYS[6], 'claimed_' .. kind, claimed)
    local delivered = tonumber(redis.call('HGET', KEYS[6], 'delivered_' .. kind) or '0')
    local counted = tonumber(redis.call('HGET', KEYS[6], 'counted_' .. kind) or '0')
    local now_due = math.max(math.min(claims, delivered) - counted, 0)
    redis.call('HINCRBY', KEYS[6], 'counted_' .. kind, now_due)
    return now_due, claims - counted
  end
  local steps_pending
  steps, steps_pending = due('steps', steps)
  steps_uncounted = steps_pending - steps
  episodes, pending = due('episodes', episodes)
end
-- The counted episodes are the oldest `episodes` of the pending ones: their returns, where the
-- report still carries them, are what the member's record gets.
local first = math.max(returns - pending + 1, 1)
local last = returns - pending + episodes
redis.call('HSET', KEYS[1], actor, ARGV[2])
local run_steps = redis.call('HINCRBY', KEYS[2], 'env_steps', steps)
redis.call('HINCRBY', KEYS[3], ARGV[3], steps)
redis.call('HINCRBY', KEYS[2], 'episodes', episodes)
local recent = {}
local pushed = false
for i = 9 + first, 9 + last do
  if ARGV[i] ~= '-' then
    redis.call('LPUSH', KEYS[4], ARGV[i])
    pushed = true
  end
end
if pushed then
  redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[8]) - 1)
  recent = redis.call('LRANGE', KEYS[4], 0, -1)
end
return {steps, episodes, run_steps, recent, pending - episodes, steps_uncounted}
"""


# KEYS: deliveries, then each name's tally. ARGV: the learner's session, then (name, steps total,
# episode ends total) for each name, in the order of KEYS.
ADD_DELIVERIES = """
local session = ARGV[1]
for i = 2, #KEYS do
  local a = 2 + (i - 2) * 3
  local field = session .. ':' .. ARGV[a]
  local steps, episodes = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local heard_steps, heard_episodes = 0, 0
  local heard = redis.call('HGET', KEYS[1], field)
  if heard then
    local s, e = string.match(heard, '^(%d+):(%d+)$')
    heard_steps, heard_episodes = tonumber(s), tonumber(e)
  end
  if steps > heard_steps then redis.call('HINCRBY', KEYS[i], 'delivered_steps', steps - heard_steps) end
  if episodes > heard_episodes then
    redis.call('HINCRBY', KEYS[i], 'delivered_episodes', episodes - heard_episodes)
  end
  redis.call('HSET', KEYS[1], field, math.max(steps, heard_steps) .. ':' .. math.max(episodes, heard_episodes))
end
"""
