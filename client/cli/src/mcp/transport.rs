//! The stdio transport of `baton mcp`: JSON-RPC messages, one a line, read from stdin and
//! written to stdout. It is ours, not rmcp's, because rmcp's says nothing to a line that is not
//! JSON and answers an invalid request without an `id`, so the client waits for an answer that
//! never comes. Here every line rmcp could not take as a message is answered at once, as
//! JSON-RPC 2.0 asks: `-32700` for a line that is not JSON, `-32600` for an invalid request,
//! `-32602` for a request whose `params` do not fit its method, each with the request's own
//! `id` when it has a usable one and `"id": null` otherwise. A malformed notification or
//! response is never answered (JSON-RPC answers neither), only logged. A
//! `notifications/cancelled` is shown to the caller's hook as it is read, before any later
//! message is handed on, so that the server sees every cancel before what follows it.
//!
//! What must never live here: anything about tools or Baton (`mod.rs`, `agent.rs`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

use rmcp::model::{ClientJsonRpcMessage, ClientNotification, JsonRpcMessage, RequestId};
use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, Mutex};

/// The longest line read. Baton refuses any body over 1 MiB, so no tool call it could take
/// comes near this; a longer line is answered `-32600` and skipped, never buffered whole.
const LINE_BYTES_MAX: usize = 4 * 1024 * 1024;
/// How many messages are read ahead of the server.
const READ_AHEAD_MAX: usize = 64;

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const INVALID_PARAMS: i64 = -32602;

/// What writes to the client: stdout, or a test's pipe. One message is one write, under the
/// lock, so answers and our own errors never interleave.
type Output = Arc<Mutex<Pin<Box<dyn AsyncWrite + Send>>>>;

/// The transport: messages read (and judged) by a task of their own, so that receiving is
/// cancel-safe, as rmcp's service loop needs; answers written to the shared output.
pub struct LineTransport {
    messages: mpsc::Receiver<ClientJsonRpcMessage>,
    output: Output,
}

impl std::fmt::Debug for LineTransport {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("LineTransport")
            .finish_non_exhaustive()
    }
}

/// The transport over this process's stdin and stdout; `on_cancel` sees the id of every
/// request the client cancels, as the cancel is read.
pub fn stdio(on_cancel: impl Fn(&RequestId) + Send + 'static) -> LineTransport {
    LineTransport::new(tokio::io::stdin(), tokio::io::stdout(), on_cancel)
}

impl LineTransport {
    /// Reads messages from `input` and writes answers to `output`. The reading ends when
    /// `input` does, which ends the MCP connection.
    pub fn new(
        input: impl AsyncRead + Send + Unpin + 'static,
        output: impl AsyncWrite + Send + 'static,
        on_cancel: impl Fn(&RequestId) + Send + 'static,
    ) -> LineTransport {
        let output: Output = Arc::new(Mutex::new(Box::pin(output)));
        let (sender, messages) = mpsc::channel(READ_AHEAD_MAX);
        tokio::spawn(read_messages(input, sender, Arc::clone(&output), on_cancel));
        LineTransport { messages, output }
    }
}

impl Transport<RoleServer> for LineTransport {
    type Error = io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), io::Error>> + Send + 'static {
        let output = Arc::clone(&self.output);
        async move {
            let line = serde_json::to_vec(&item).map_err(io::Error::other)?;
            write_line(&output, line).await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        self.messages.recv().await
    }

    async fn close(&mut self) -> Result<(), io::Error> {
        self.messages.close();
        self.output.lock().await.flush().await
    }
}

/// Reads lines until `input` ends or the server stops listening, and either hands each on as
/// a message or answers it with a JSON-RPC error.
async fn read_messages(
    input: impl AsyncRead + Unpin,
    messages: mpsc::Sender<ClientJsonRpcMessage>,
    output: Output,
    on_cancel: impl Fn(&RequestId),
) {
    let mut input = BufReader::new(input);
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = match read_line(&mut input, &mut line).await {
            Ok(read) => read,
            Err(error) => {
                tracing::debug!(%error, "reading stdin failed; the MCP connection ends");
                return;
            }
        };
        let incoming = match read {
            Read::End => return,
            Read::TooLong => Incoming::Refused {
                id: Value::Null,
                code: INVALID_REQUEST,
                message: format!(
                    "Invalid Request: a message longer than {LINE_BYTES_MAX} bytes was skipped"
                ),
            },
            Read::Line => judge(&line),
        };
        match incoming {
            Incoming::Message(message) => {
                if let Some(id) = cancelled_request(&message) {
                    on_cancel(id);
                }
                if messages.send(*message).await.is_err() {
                    return;
                }
            }
            Incoming::Blank => {}
            Incoming::Unanswered(reason) => {
                tracing::debug!(reason, "a malformed notification or response was skipped");
            }
            Incoming::Refused { id, code, message } => {
                let answer = json!({"jsonrpc": "2.0", "id": id,
                                    "error": {"code": code, "message": message}});
                if write_line(&output, answer.to_string().into_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}

/// The request a `notifications/cancelled` cancels.
fn cancelled_request(message: &ClientJsonRpcMessage) -> Option<&RequestId> {
    match message {
        JsonRpcMessage::Notification(notification) => match &notification.notification {
            ClientNotification::CancelledNotification(cancelled) => {
                cancelled.params.request_id.as_ref()
            }
            _ => None,
        },
        _ => None,
    }
}

/// What one line of input reads as.
#[derive(Debug)]
enum Incoming {
    Message(Box<ClientJsonRpcMessage>),
    /// An empty line: skipped, as rmcp does.
    Blank,
    /// A notification or response that is not well formed: JSON-RPC answers neither.
    Unanswered(String),
    /// A line answered with this JSON-RPC error.
    Refused {
        id: Value,
        code: i64,
        message: String,
    },
}

/// Judges one line (its `\n` included, if it had one).
fn judge(line: &[u8]) -> Incoming {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    // RFC 8259 lets a parser ignore a leading byte order mark; rmcp does too.
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Incoming::Blank;
    }
    let value: Value = match serde_json::from_slice(line) {
        Ok(value) => value,
        Err(error) => {
            return Incoming::Refused {
                id: Value::Null,
                code: PARSE_ERROR,
                message: format!("Parse error: the line is not JSON ({error})"),
            }
        }
    };
    let error = match serde_json::from_slice::<ClientJsonRpcMessage>(line) {
        Ok(message) => return Incoming::Message(Box::new(message)),
        Err(error) => error,
    };
    let Value::Object(object) = value else {
        return Incoming::Refused {
            id: Value::Null,
            code: INVALID_REQUEST,
            message: "Invalid Request: a message is one JSON object (batches are not part of MCP)"
                .to_owned(),
        };
    };
    let has_method = object.get("method").is_some_and(Value::is_string);
    let Some(id) = object.get("id") else {
        if has_method || object.contains_key("result") || object.contains_key("error") {
            return Incoming::Unanswered(error.to_string());
        }
        return Incoming::Refused {
            id: Value::Null,
            code: INVALID_REQUEST,
            message: format!("Invalid Request: {error}"),
        };
    };
    let usable = id.is_string() || id.is_i64();
    if usable && !has_method && (object.contains_key("result") || object.contains_key("error")) {
        return Incoming::Unanswered(error.to_string());
    }
    if !usable {
        return Incoming::Refused {
            id: Value::Null,
            code: INVALID_REQUEST,
            message: "Invalid Request: `id` must be a string or an integer".to_owned(),
        };
    }
    let well_formed = object.get("jsonrpc") == Some(&Value::from("2.0")) && has_method;
    let (code, kind) = if well_formed {
        (INVALID_PARAMS, "Invalid params")
    } else {
        (INVALID_REQUEST, "Invalid Request")
    };
    Incoming::Refused {
        id: id.clone(),
        code,
        message: format!("{kind}: {error}"),
    }
}

/// How a read of one line ended.
#[derive(Debug, PartialEq, Eq)]
enum Read {
    /// A line is in the buffer (the last one may lack its `\n`).
    Line,
    /// A line longer than [`LINE_BYTES_MAX`] was read past and dropped.
    TooLong,
    /// The input ended.
    End,
}

/// Reads one line into `line`, never holding more than [`LINE_BYTES_MAX`] bytes of it.
async fn read_line(
    input: &mut BufReader<impl AsyncRead + Unpin>,
    line: &mut Vec<u8>,
) -> io::Result<Read> {
    let mut too_long = false;
    loop {
        let available = input.fill_buf().await?;
        if available.is_empty() {
            return Ok(match (too_long, line.is_empty()) {
                (true, _) => Read::TooLong,
                (false, true) => Read::End,
                (false, false) => Read::Line,
            });
        }
        let newline = available.iter().position(|byte| *byte == b'\n');
        let take = newline.map_or(available.len(), |at| at + 1);
        if !too_long {
            if line.len() + take > LINE_BYTES_MAX {
                too_long = true;
                line.clear();
            } else {
                line.extend_from_slice(&available[..take]);
            }
        }
        input.consume(take);
        if newline.is_some() {
            return Ok(if too_long { Read::TooLong } else { Read::Line });
        }
    }
}

async fn write_line(output: &Output, mut line: Vec<u8>) -> io::Result<()> {
    line.push(b'\n');
    let mut output = output.lock().await;
    output.write_all(&line).await?;
    output.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(line: &str) -> (Value, i64) {
        match judge(line.as_bytes()) {
            Incoming::Refused { id, code, .. } => (id, code),
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn every_line_that_is_not_a_message_is_answered_unless_it_is_a_notification() {
        for (line, id, code) in [
            ("not json", Value::Null, PARSE_ERROR),
            ("{\"jsonrpc\": \"2.0\", \"id\": 1", Value::Null, PARSE_ERROR),
            ("{\"foo\": \"bar\"}", Value::Null, INVALID_REQUEST),
            ("[]", Value::Null, INVALID_REQUEST),
            ("42", Value::Null, INVALID_REQUEST),
            (
                r#"{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}"#,
                Value::Null,
                INVALID_REQUEST,
            ),
            (
                r#"{"jsonrpc": "1.0", "id": 3, "method": "ping"}"#,
                json!(3),
                INVALID_REQUEST,
            ),
            (
                r#"{"jsonrpc": "2.0", "id": "a", "method": "tools/call", "params": 5}"#,
                json!("a"),
                INVALID_PARAMS,
            ),
        ] {
            assert_eq!(refusal(line), (id, code), "{line}");
        }
        for unanswered in [
            r#"{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": 5}"#,
            r#"{"jsonrpc": "2.0", "id": 4, "result": 5, "error": 6}"#,
        ] {
            assert!(
                matches!(judge(unanswered.as_bytes()), Incoming::Unanswered(_)),
                "{unanswered}"
            );
        }
        for message in [
            "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"ping\"}\r\n",
            "\u{feff}{\"jsonrpc\": \"2.0\", \"method\": \"notifications/initialized\"}",
        ] {
            assert!(
                matches!(judge(message.as_bytes()), Incoming::Message(_)),
                "{message:?}"
            );
        }
        assert!(matches!(judge(b"  \r\n"), Incoming::Blank));
    }

    #[tokio::test]
    async fn a_line_too_long_is_skipped_whole_and_the_next_one_read() {
        let mut input = vec![b'x'; LINE_BYTES_MAX + 10];
        input.extend_from_slice(b"\nnext\nlast");
        let mut input = BufReader::with_capacity(1024, &input[..]);
        let mut line = Vec::new();
        assert_eq!(
            read_line(&mut input, &mut line).await.unwrap(),
            Read::TooLong
        );
        assert!(line.len() <= LINE_BYTES_MAX);
        line.clear();
        assert_eq!(read_line(&mut input, &mut line).await.unwrap(), Read::Line);
        assert_eq!(line, b"next\n");
        line.clear();
        assert_eq!(read_line(&mut input, &mut line).await.unwrap(), Read::Line);
        assert_eq!(line, b"last");
        line.clear();
        assert_eq!(read_line(&mut input, &mut line).await.unwrap(), Read::End);
    }

    #[tokio::test]
    async fn refusals_are_written_and_messages_handed_on() {
        let (mut client, server) = tokio::io::duplex(4096);
        let (read, write) = tokio::io::split(server);
        let cancels = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = Arc::clone(&cancels);
        let mut transport = LineTransport::new(read, write, move |id: &RequestId| {
            seen.lock().unwrap().push(id.clone());
        });
        client
            .write_all(
                b"oops\n{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\
                  \"params\":{\"requestId\":4}}\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n",
            )
            .await
            .unwrap();
        let cancel = transport.receive().await.expect("the cancel");
        assert!(matches!(cancel, ClientJsonRpcMessage::Notification(_)));
        assert_eq!(*cancels.lock().unwrap(), [RequestId::Number(4)]);
        let message = transport.receive().await.expect("the ping");
        assert!(matches!(message, ClientJsonRpcMessage::Request(_)));
        let mut answer = String::new();
        BufReader::new(&mut client)
            .read_line(&mut answer)
            .await
            .unwrap();
        let answer: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["id"], Value::Null);
        assert_eq!(answer["error"]["code"], PARSE_ERROR);
    }
}
