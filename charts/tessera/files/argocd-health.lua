-- Argo CD health of Tessera's kinds (tessera.io Volume, VolumeAttachment, MountPod),
-- read from the status the way kstatus reads it (docs/gitops.md):
--   being deleted, or the status not yet for this generation  -> Progressing
--   condition Stalled=True (a failed mount, a ticket that cannot be honoured, a
--     missing Volume, node or agent: a person must act)        -> Degraded
--   condition Reconciling=True (attaching, detaching, waiting) -> Progressing
--   condition Ready=True                                       -> Healthy
--   otherwise (no status or no Ready yet, Ready=False)         -> Progressing
-- The same script serves the three kinds: config/argocd/argocd-cm.yaml installs it.
local hs = {}
local meta = obj.metadata or {}
if meta.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "being deleted"
  return hs
end
local st = obj.status
if st == nil then
  hs.status = "Progressing"
  hs.message = "waiting for Tessera to report a status"
  return hs
end
if meta.generation ~= nil and st.observedGeneration ~= meta.generation then
  hs.status = "Progressing"
  hs.message = "generation " .. tostring(meta.generation) .. " not observed yet (status is of "
    .. tostring(st.observedGeneration) .. ")"
  return hs
end
local stalled, reconciling, ready
for _, c in ipairs(st.conditions or {}) do
  if c.type == "Stalled" and c.status == "True" then
    stalled = c
  elseif c.type == "Reconciling" and c.status == "True" then
    reconciling = c
  elseif c.type == "Ready" then
    ready = c
  end
end
local function said(c)
  local reason = c.reason or ""
  if c.message ~= nil and c.message ~= "" then
    return reason .. ": " .. c.message
  end
  return reason
end
if stalled ~= nil then
  hs.status = "Degraded"
  hs.message = said(stalled)
elseif reconciling ~= nil then
  hs.status = "Progressing"
  hs.message = said(reconciling)
elseif ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = said(ready)
elseif ready ~= nil then
  hs.status = "Progressing"
  hs.message = said(ready)
else
  hs.status = "Progressing"
  hs.message = "no Ready condition yet"
end
return hs
