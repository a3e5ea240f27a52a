package main

import "net/http"

// csrfCookie carries the page's token back with an action's POST.
const csrfCookie = "kafkaonce_csrf"

// actions registers the actions: none yet, the page is read-only.
func (p *page) actions(mux *http.ServeMux) {}
