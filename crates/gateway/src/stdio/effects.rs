//! The driver's side of the session's effects: each [`Effect`] performed
//! in order, outside any lock, with what it causes fed back as events.

use super::*;

impl Driver {
    /// Performs the session's effects in order; events they cause (a
    /// failed host write, a server found exited) go to `follow`.
    pub(super) fn perform(&mut self, effects: Vec<Effect>, follow: &mut VecDeque<Event>) {
        for effect in effects {
            match effect {
                Effect::WriteHost(line) => self.write_host(&line, follow),
                Effect::WriteServer { gen, mut line } => {
                    if let (true, Some(stdin)) = (gen == self.server.gen, &mut self.server.stdin) {
                        line.push(b'\n');
                        match stdin.send(line) {
                            server_in::Sent::Ok => {}
                            // a stdin that is gone stays gone; the session
                            // learns of it from stdout's end and the exit
                            server_in::Sent::Gone => self.server.stdin = None,
                            // hung: stopped, and the session answers what
                            // it owed when the exit is seen
                            server_in::Sent::OverBudget => {
                                tracing::warn!(
                                    "the server left {} MiB of its input unread: stopped as hung",
                                    server_in::SERVER_IN_BUDGET >> 20
                                );
                                self.server.stdin = None;
                                if let Some(c) = self.control(gen) {
                                    let _ = c.terminate();
                                }
                            }
                        }
                    }
                }
                Effect::CloseServerStdin { gen } => {
                    if gen == self.server.gen {
                        self.server.stdin = None;
                    }
                }
                Effect::TerminateServer { gen } => {
                    if let Some(c) = self.control(gen) {
                        let _ = c.terminate();
                    }
                }
                Effect::KillServer { gen } => {
                    if let Some(c) = self.control(gen) {
                        let _ = c.kill();
                    }
                }
                Effect::CheckServer { gen } => {
                    if let Some(c) = self.control(gen) {
                        let exit = match c.try_wait() {
                            Ok(Some(info)) => Some(info),
                            Ok(None) => None,
                            Err(_) => Some(ExitInfo {
                                code: None,
                                signal: None,
                            }),
                        };
                        if let Some(exit) = exit {
                            follow.push_back(Event::ServerExited { gen, exit });
                        }
                    }
                }
                Effect::StartServer {
                    gen,
                    secrets,
                    refresh,
                } => {
                    if self.launch_tx.send((gen, secrets, refresh)).is_err() {
                        follow.push_back(Event::ServerStartFailed {
                            gen,
                            error: "launcher thread gone".into(),
                        });
                    }
                }
                Effect::Audit(mut record) => {
                    let call_record = record.event.kind == Some(mcpbox_audit::Kind::ToolCall);
                    if let (Some(files), true) = (&mut self.files, call_record) {
                        // watched: the kernel's list replaces the walk (a
                        // call never forwarded touched nothing), with or
                        // without an output directory
                        let call = record
                            .event
                            .detail
                            .get("call")
                            .and_then(serde_json::Value::as_str);
                        record.files = Some(call.and_then(|c| files.take(c)).unwrap_or_default());
                    }
                    self.audit_batch.push(record);
                }
                Effect::CommitAudit { key, event } => {
                    // On this thread, now, before anything else of the
                    // session happens: the call it starts waits for the
                    // answer, and goes to the server only once the record
                    // is committed (one SQLite transaction; the records
                    // queued for the writer thread are not waited for, so
                    // a start may precede them in the log).
                    let result = self.audit.commit(event);
                    follow.push_back(Event::AuditCommitted { key, result });
                }
                Effect::WritePins(w) => {
                    // before the host sees the list: `mcpbox pin accept`
                    // may run as soon as it has
                    if let Err(e) = w.write() {
                        tracing::error!("{e}");
                    }
                }
                Effect::CheckArguments {
                    key,
                    tool,
                    arguments,
                } => {
                    // on the driver's thread, outside the session core: the
                    // binary's rules parse a command line in a child process
                    let check = self.policy.check_arguments(&tool, arguments.as_ref());
                    follow.push_back(Event::ArgumentsChecked {
                        key,
                        check: check.map(Box::new),
                    });
                }
                Effect::AskApprover { key, ask } => {
                    let answer = match &self.broker {
                        Some(b) => {
                            let inbox = self.inbox.clone();
                            let deliver: crate::broker::Deliver = Box::new(move |a| {
                                let answer = from_broker(a);
                                let _ = inbox.send(Input::Event(Event::Approval { key, answer }));
                            });
                            let (id, tool) = (ask.id.clone(), ask.binding.tool.clone());
                            match b.ask(ask, deliver) {
                                crate::broker::Asked::Held => {
                                    tracing::info!(approval = %id, %tool, "waiting for a human: {}", crate::broker::approve_command(&id));
                                    // now the host's form, if it has one
                                    follow.push_back(Event::ApprovalHeld { key });
                                    None
                                }
                                crate::broker::Asked::Granted { id, by, .. } => {
                                    Some(crate::ApprovalAnswer::Approved {
                                        approver: format!("{by}:{id}"),
                                    })
                                }
                                crate::broker::Asked::TooMany => {
                                    tracing::warn!(%tool, "too many approvals open in this session: refused without asking");
                                    Some(crate::ApprovalAnswer::Unavailable)
                                }
                                crate::broker::Asked::Closed { id } => {
                                    tracing::warn!(approval = %id, %tool, "the host approved in its retry, but a human had denied the approval first (or it lapsed, or the call now measures more than was approved)");
                                    Some(crate::ApprovalAnswer::Declined)
                                }
                                crate::broker::Asked::Refused { id } => {
                                    tracing::warn!(approval = %id, %tool, "refused until a human approves: {}", crate::broker::approve_command(&id));
                                    Some(crate::ApprovalAnswer::Refused { id })
                                }
                            }
                        }
                        None => Some(crate::ApprovalAnswer::Unavailable),
                    };
                    if let Some(answer) = answer {
                        follow.push_back(Event::Approval { key, answer });
                    }
                }
                Effect::ApprovalClosed { id, how } => {
                    if let Some(b) = &self.broker {
                        b.close(&id, how);
                    }
                }
                Effect::Answer { ticket, answer } => {
                    if let Some(reply) = self.replies.remove(&ticket) {
                        let _ = reply.send(answer);
                    }
                }
                Effect::End(outcome) => {
                    self.server.stdin = None;
                    self.outcome = Some(outcome);
                }
            }
        }
        if self.host_dirty {
            self.host_dirty = false;
            if !self.host_failed && self.host_out.flush().is_err() {
                self.host_gone(follow);
            }
        }
        // after the host output: the record is not on the host's path
        if !self.audit_batch.is_empty() {
            if let Some(tx) = &self.audit_tx {
                let _ = tx.send(std::mem::take(&mut self.audit_batch));
            }
        }
    }

    pub(super) fn control(&mut self, gen: u32) -> Option<&mut Box<dyn ProcessControl>> {
        if gen == self.server.gen {
            self.server.control.as_mut()
        } else {
            None
        }
    }

    pub(super) fn write_host(&mut self, line: &[u8], follow: &mut VecDeque<Event>) {
        if self.host_failed {
            return;
        }
        let ok = self.host_out.write(line).is_ok();
        self.host_dirty = true;
        if !ok {
            self.host_gone(follow);
        }
    }

    pub(super) fn host_gone(&mut self, follow: &mut VecDeque<Event>) {
        self.host_failed = true;
        follow.push_back(Event::HostGone);
    }
}

/// A broker's answer in the session's words.
fn from_broker(a: crate::broker::Answer) -> crate::ApprovalAnswer {
    match a {
        crate::broker::Answer::Approved { by, .. } => {
            crate::ApprovalAnswer::Approved { approver: by }
        }
        crate::broker::Answer::Denied { .. } => crate::ApprovalAnswer::Declined,
        crate::broker::Answer::Expired => crate::ApprovalAnswer::Timeout,
    }
}
