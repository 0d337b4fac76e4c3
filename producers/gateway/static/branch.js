// A conversation is a tree: a reply's parent_id is the user message it answers, a user message's
// parent_id is the reply it follows (null on the first turn). Regenerated replies and edited
// messages are siblings. The page shows one branch: at every turn, the sibling that was picked
// (in a version switcher, or by being just written), else the newest.

export const replyKey = (r) => r.generation_id || r.message_id;

// Messages saved before user messages carried a parent: the newest reply of the turn before.
function parentOf(user, replies) {
  if (user.parent_id !== undefined && user.parent_id !== null) return user.parent_id;
  if (!(user.turn > 0)) return null;
  const before = replies.filter((r) => r.turn === user.turn - 1);
  return before.length ? replyKey(before.at(-1)) : null;
}

function pick(list, chosen, key) {
  for (let i = list.length - 1; i >= 0; i -= 1) if (chosen.has(key(list[i]))) return i;
  return list.length - 1;
}

// [{users, userIndex, user, replies, replyIndex, reply}] from the first turn down the shown branch.
export function branchOf(messages, chosenReplies, chosenUsers) {
  const users = messages.filter((m) => m.role === "user");
  const replies = messages.filter((m) => m.role === "assistant");
  const groups = [];
  let parent = null;
  const seen = new Set();
  while (!seen.has(parent)) {
    seen.add(parent);
    const siblings = users.filter((u) => parentOf(u, replies) === parent);
    if (!siblings.length) break;
    const userIndex = pick(siblings, chosenUsers, (u) => u.message_id);
    const user = siblings[userIndex];
    const answers = replies.filter((r) => r.parent_id === user.message_id);
    const replyIndex = answers.length ? pick(answers, chosenReplies, replyKey) : -1;
    const reply = answers[replyIndex] ?? null;
    groups.push({ users: siblings, userIndex, user, replies: answers, replyIndex, reply });
    if (!reply) break;
    parent = replyKey(reply);
  }
  if (!groups.length && replies.length) { // replies whose messages are not there: show them alone
    const reply = replies.at(-1);
    groups.push({ users: [], userIndex: -1, user: null, replies: [reply], replyIndex: 0, reply });
  }
  return groups;
}

// Pick every sibling on the way from the first turn to message `id`, so the branch shows it.
export function reveal(messages, id, chosenReplies, chosenUsers) {
  const replies = messages.filter((m) => m.role === "assistant");
  const users = messages.filter((m) => m.role === "user");
  const byId = new Map(messages.map((m) => [m.role === "assistant" ? replyKey(m) : m.message_id, m]));
  let m = byId.get(id) ?? messages.find((x) => x.message_id === id);
  const seen = new Set();
  while (m && !seen.has(m)) {
    seen.add(m);
    if (m.role === "assistant") {
      for (const r of replies) if (r.parent_id === m.parent_id) chosenReplies.delete(replyKey(r));
      chosenReplies.add(replyKey(m));
      m = byId.get(m.parent_id);
    } else {
      const parent = parentOf(m, replies);
      for (const u of users) if (parentOf(u, replies) === parent) chosenUsers.delete(u.message_id);
      chosenUsers.add(m.message_id);
      m = byId.get(parent);
    }
  }
}
